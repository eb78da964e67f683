//! Where the host time of a call goes, phase by phase, for the benchmarks
//! (`benches/call_phases.py`). Built with the feature `phase-times`, a call of `add`, a users'
//! kernel or `from_dlpack` reads the clock at each phase's start and adds the time since the
//! last reading to the phase that ran, per thread; the producers' own code that cubridge calls
//! (their exports, stream and sign queries, releases) is timed apart from cubridge's. Without
//! the feature the macros below expand to nothing (a producer's call to the call itself): the
//! wheels users install read no clock, and their code is the code without the marks.
//!
//! A timed call starts with [`timed_call!`] (only the outermost call of a thread is timed; one
//! that cubridge makes from within a producer's code runs in the outer call's phases); a phase
//! is entered with [`phase!`], or at the end of a scope with [`phase_at_end!`]; a producer's
//! call is wrapped in [`producer!`], which leaves the phase around it unchanged.

/// Starts timing the enclosing function's call, until the end of its body.
#[allow(unused_macros)] // used by the Python bindings only
macro_rules! timed_call {
    () => {
        #[cfg(feature = "phase-times")]
        let _timed_call = $crate::phases::begin();
    };
}

/// Closes the phase that ran and enters `$phase` (a [`Phase`] variant).
macro_rules! phase {
    ($phase:ident) => {
        #[cfg(feature = "phase-times")]
        $crate::phases::enter($crate::phases::Phase::$phase);
    };
}

/// Enters `$phase` at the end of the enclosing scope (after its value is made, before its
/// locals drop), or, given a condition, there where it holds.
#[allow(unused_macros)] // used by the Python bindings only
macro_rules! phase_at_end {
    ($phase:ident) => {
        #[cfg(feature = "phase-times")]
        let _at_end = $crate::phases::AtEnd($crate::phases::Phase::$phase, true);
    };
    ($phase:ident if $cond:expr) => {
        #[cfg(feature = "phase-times")]
        let _at_end = $crate::phases::AtEnd($crate::phases::Phase::$phase, $cond);
    };
}

/// `$call`, a producer's code, timed as `$phase`; the phase around it goes on afterwards.
#[allow(unused_macros)] // used by the Python bindings only
macro_rules! producer {
    ($phase:ident, $call:expr) => {{
        #[cfg(feature = "phase-times")]
        let value = $crate::phases::time_producer($crate::phases::Phase::$phase, || $call);
        #[cfg(not(feature = "phase-times"))]
        let value = $call;
        value
    }};
}

#[allow(unused_imports)] // the Python bindings use them all
pub(crate) use {phase, phase_at_end, producer, timed_call};

#[cfg(feature = "phase-times")]
pub use timed::{begin, enter, take, time_producer, AtEnd, Phase};

#[cfg(feature = "phase-times")]
mod timed {
    /// What a stretch of a call's host time did.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub enum Phase {
        /// The call's own arguments: `stream=`, scalars, keywords.
        Args,
        /// cubridge's part of importing the operands: protocol lookups, descriptor checks, views.
        Import,
        /// A producer's export: `__dlpack__`, or the exchange table's view of a tensor (its
        /// owning export, for a view kept past the call, asks for the stream within it).
        ProducerExport,
        /// A producer's current stream: the exchange table's `current_work_stream`, CuPy's.
        ProducerStream,
        /// A producer's answers about a tensor: torch's `is_neg()`, `requires_grad`.
        ProducerQuery,
        /// The arguments bound to the kernel: dtypes, shapes, devices, outputs checked.
        Bind,
        /// The stream's capture query (a driver call) where a CUDA launch begins.
        Capture,
        /// The launch planned: broadcast views, the kernel's variant, its function looked up.
        Plan,
        /// Results allocated (the device's pool, or host memory).
        Alloc,
        /// Operands ordered before the launch (events waited for) and the context bound.
        Order,
        /// The kernel's parameters and the driver's launch.
        Launch,
        /// The launch closed: events recorded, operands kept until the kernel has run.
        Finish,
        /// The loop over host memory.
        HostLoop,
        /// The interpreter let go and taken back around CUDA work.
        Gil,
        /// The result returned to Python (a new array object, or `out`).
        Result,
        /// What the call drops as it returns: views, context restore, deferred releases.
        Exit,
        /// A producer's memory let go as an imported view goes: its DLPack deleter, or the
        /// reference to its object.
        ProducerRelease,
    }

    /// Every phase, in the order of [`Phase`].
    pub const PHASES: [Phase; 17] = [
        Phase::Args,
        Phase::Import,
        Phase::ProducerExport,
        Phase::ProducerStream,
        Phase::ProducerQuery,
        Phase::Bind,
        Phase::Capture,
        Phase::Plan,
        Phase::Alloc,
        Phase::Order,
        Phase::Launch,
        Phase::Finish,
        Phase::HostLoop,
        Phase::Gil,
        Phase::Result,
        Phase::Exit,
        Phase::ProducerRelease,
    ];

    impl Phase {
        /// The phase's name in [`take`]'s table.
        pub fn name(self) -> &'static str {
            match self {
                Phase::Args => "args",
                Phase::Import => "import",
                Phase::ProducerExport => "producer export",
                Phase::ProducerStream => "producer stream",
                Phase::ProducerQuery => "producer query",
                Phase::Bind => "bind",
                Phase::Capture => "capture query",
                Phase::Plan => "plan",
                Phase::Alloc => "alloc",
                Phase::Order => "order",
                Phase::Launch => "launch",
                Phase::Finish => "finish",
                Phase::HostLoop => "host loop",
                Phase::Gil => "gil",
                Phase::Result => "result",
                Phase::Exit => "exit",
                Phase::ProducerRelease => "producer release",
            }
        }
    }

    /// The phases' totals since the last [`take`]: calls timed, then per phase its name, its
    /// nanoseconds and the clock readings that closed it (a call also reads the clock once as
    /// it begins); and what one reading costs (ns, the least of several measurements now, NaN
    /// when asked from within a timed call).
    pub struct Totals {
        pub calls: u64,
        pub phases: Vec<(&'static str, u64, u64)>,
        pub reading_ns: f64,
    }

    use std::cell::RefCell;
    use std::time::Instant;

    struct State {
        depth: u32,
        last: Instant,
        current: Phase,
        calls: u64,
        ns: [u64; PHASES.len()],
        readings: [u64; PHASES.len()],
    }

    thread_local! {
        static STATE: RefCell<State> = RefCell::new(State {
            depth: 0,
            last: Instant::now(),
            current: Phase::Args,
            calls: 0,
            ns: [0; PHASES.len()],
            readings: [0; PHASES.len()],
        });
    }

    impl State {
        /// The time since the last reading, added to `to`.
        fn close(&mut self, to: Phase) {
            let now = Instant::now();
            let k = to as usize;
            self.ns[k] += now.duration_since(self.last).as_nanos() as u64;
            self.readings[k] += 1;
            self.last = now;
        }
    }

    /// A timed call, from [`begin`] until it is dropped.
    pub struct Call(());

    pub fn begin() -> Call {
        STATE.with_borrow_mut(|s| {
            s.depth += 1;
            if s.depth == 1 {
                s.calls += 1;
                s.current = Phase::Args;
                s.last = Instant::now();
            }
        });
        Call(())
    }

    impl Drop for Call {
        fn drop(&mut self) {
            STATE.with_borrow_mut(|s| {
                if s.depth == 1 {
                    let current = s.current;
                    s.close(current);
                }
                s.depth -= 1;
            });
        }
    }

    pub fn enter(phase: Phase) {
        STATE.with_borrow_mut(|s| {
            if s.depth == 1 {
                let current = s.current;
                s.close(current);
                s.current = phase;
            }
        });
    }

    /// Enters its phase when dropped, where its flag holds ([`phase_at_end!`]).
    pub struct AtEnd(pub Phase, pub bool);

    impl Drop for AtEnd {
        fn drop(&mut self) {
            if self.1 {
                enter(self.0);
            }
        }
    }

    pub fn time_producer<R>(phase: Phase, f: impl FnOnce() -> R) -> R {
        let timed = STATE.with_borrow_mut(|s| {
            let timed = s.depth == 1;
            if timed {
                let current = s.current;
                s.close(current);
                // The producer's code may call into cubridge: not as a call of its own.
                s.depth += 1;
            }
            timed
        });
        let _back = timed.then(|| Back(phase));
        f()
    }

    /// Closes a producer's phase and leaves its nesting, also when its code unwinds.
    struct Back(Phase);

    impl Drop for Back {
        fn drop(&mut self) {
            STATE.with_borrow_mut(|s| {
                s.depth -= 1;
                s.close(self.0);
            });
        }
    }

    pub fn take() -> Totals {
        let reading_ns = reading_cost();
        STATE.with_borrow_mut(|s| {
            let phases = PHASES
                .iter()
                .map(|p| (p.name(), s.ns[*p as usize], s.readings[*p as usize]))
                .collect();
            let calls = s.calls;
            (s.calls, s.ns, s.readings) = (0, [0; PHASES.len()], [0; PHASES.len()]);
            Totals {
                calls,
                phases,
                reading_ns,
            }
        })
    }

    /// What one clock reading with its bookkeeping costs, in ns: the time of many [`enter`]s
    /// in a timed call, each closing a phase, the least of several rounds (a round that the
    /// machine interrupts reads high). NaN within a timed call, whose state it would disturb.
    fn reading_cost() -> f64 {
        const N: u32 = 20_000;
        if STATE.with_borrow(|s| s.depth) != 0 {
            return f64::NAN;
        }
        let saved = STATE.with_borrow(|s| (s.calls, s.ns, s.readings));
        let mut least = f64::INFINITY;
        for _ in 0..7 {
            let start = Instant::now();
            {
                let _call = begin();
                for _ in 0..N {
                    enter(Phase::Args);
                }
            }
            // N readings, one as the call begins and one as it ends.
            least = least.min(start.elapsed().as_nanos() as f64 / f64::from(N + 2));
        }
        STATE.with_borrow_mut(|s| (s.calls, s.ns, s.readings) = saved);
        least
    }
}

#[cfg(all(test, feature = "phase-times"))]
mod tests {
    use super::timed::Totals;
    use super::*;

    fn ns_of(totals: &Totals, name: &str) -> (u64, u64) {
        let row = totals.phases.iter().find(|p| p.0 == name).unwrap();
        (row.1, row.2)
    }

    #[test]
    fn phases_are_timed_for_the_outermost_call_only() {
        take();
        let spin = |d: std::time::Duration| {
            let t = std::time::Instant::now();
            while t.elapsed() < d {}
        };
        let ms = std::time::Duration::from_millis(2);
        {
            timed_call!();
            spin(ms);
            phase!(Import);
            spin(ms);
            producer!(ProducerExport, {
                // A call made from within a producer's code is not a call of its own.
                timed_call!();
                phase!(Launch);
                spin(ms);
            });
            spin(ms);
            phase_at_end!(Exit);
            phase!(Result);
        }
        let totals = take();
        assert_eq!(totals.calls, 1);
        assert!(totals.reading_ns > 0.0);
        let (args, import, export) = (
            ns_of(&totals, "args"),
            ns_of(&totals, "import"),
            ns_of(&totals, "producer export"),
        );
        let at_least = ms.as_nanos() as u64;
        assert!(args.0 >= at_least && export.0 >= at_least && import.0 >= 2 * at_least);
        assert_eq!((args.1, import.1, export.1), (1, 2, 1));
        // Nothing ran in the nested call's phase; the scope's end entered Exit after Result.
        assert_eq!(ns_of(&totals, "launch"), (0, 0));
        assert_eq!(
            (ns_of(&totals, "result").1, ns_of(&totals, "exit").1),
            (1, 1)
        );
        assert_eq!(take().calls, 0);
    }

    #[test]
    fn a_producer_that_panics_leaves_the_next_calls_timed() {
        take();
        let unwound = std::panic::catch_unwind(|| {
            timed_call!();
            producer!(ProducerExport, panic!("a producer's code failed"));
        });
        assert!(unwound.is_err());
        {
            timed_call!();
            phase!(Import);
        }
        let totals = take();
        assert_eq!(totals.calls, 2);
        assert_eq!(ns_of(&totals, "import").1, 1);
        assert!(totals.reading_ns > 0.0);
    }

    #[test]
    fn producers_code_outside_a_call_leaves_the_next_calls_timed() {
        take();
        // A producer's release run as a view goes after its call (a result dropped by Python).
        producer!(ProducerRelease, ());
        {
            timed_call!();
            producer!(ProducerExport, ());
        }
        {
            timed_call!();
        }
        let totals = take();
        assert_eq!(totals.calls, 2);
        assert_eq!(ns_of(&totals, "producer export").1, 1);
        assert_eq!(ns_of(&totals, "producer release").1, 0);
    }
}
