//! State shared by every thread of a demo run: the workload, the tracker,
//! the engine of the current generation, and the first fatal error.

use super::tracker::Tracker;
use super::workload::Workload;
use kairos::Engine;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;

/// Shared by producers, the canceller, consumers and the main thread.
#[derive(Debug)]
pub struct Context {
    /// What to schedule.
    pub workload: Workload,
    /// What happened to every task.
    pub tracker: Tracker,
    /// The engine of the current generation.
    pub cell: EngineCell,
    fatal: Mutex<Option<String>>,
}

impl Context {
    /// A context for `workload`, starting with `engine` as generation 1.
    pub fn new(workload: Workload, engine: Arc<Engine>) -> Context {
        Context {
            workload,
            tracker: Tracker::new(workload.tasks),
            cell: EngineCell::new(engine),
            fatal: Mutex::new(None),
        }
    }

    /// Records an unexpected error (the first one wins) and stops the
    /// producers and the canceller. The main thread reports it.
    pub fn fail(&self, error: String) {
        self.fatal.lock().get_or_insert(error);
        self.cell.stop();
    }

    /// The first unexpected error, if any thread hit one.
    pub fn failure(&self) -> Option<String> {
        self.fatal.lock().clone()
    }
}

/// The engine of the current generation, swapped at the restart. Producers
/// and the canceller fetch it for each call; when a call fails with
/// `Closed` they wait here for the next generation and retry.
#[derive(Debug)]
pub struct EngineCell {
    slot: Mutex<Slot>,
    changed: Condvar,
}

#[derive(Debug)]
struct Slot {
    generation: u32,
    engine: Option<Arc<Engine>>,
    stopped: bool,
}

impl EngineCell {
    fn new(engine: Arc<Engine>) -> EngineCell {
        EngineCell {
            slot: Mutex::new(Slot {
                generation: 1,
                engine: Some(engine),
                stopped: false,
            }),
            changed: Condvar::new(),
        }
    }

    /// The engine of generation `min_generation` or later with its
    /// generation, waiting through a restart; `None` once stopped.
    pub fn get(&self, min_generation: u32) -> Option<(u32, Arc<Engine>)> {
        let mut slot = self.slot.lock();
        loop {
            if slot.stopped {
                return None;
            }
            if let Some(engine) = slot
                .engine
                .as_ref()
                .filter(|_| slot.generation >= min_generation)
            {
                return Some((slot.generation, Arc::clone(engine)));
            }
            self.changed.wait(&mut slot);
        }
    }

    /// The current engine, without waiting (`None` during a restart).
    pub fn current(&self) -> Option<Arc<Engine>> {
        self.slot.lock().engine.clone()
    }

    /// Removes the current engine (to shut it down); callers of
    /// [`EngineCell::get`] wait until [`EngineCell::install`].
    pub fn take(&self) -> Option<Arc<Engine>> {
        self.slot.lock().engine.take()
    }

    /// Installs the engine of the next generation and wakes the waiters.
    pub fn install(&self, engine: Arc<Engine>) {
        let mut slot = self.slot.lock();
        slot.generation += 1;
        slot.engine = Some(engine);
        self.changed.notify_all();
    }

    /// Ends the run: [`EngineCell::get`] returns `None` from now on.
    pub fn stop(&self) {
        self.slot.lock().stopped = true;
        self.changed.notify_all();
    }

    /// Whether [`EngineCell::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.slot.lock().stopped
    }
}
