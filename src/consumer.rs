//! The consumer side: a handle that receives due tasks, and the delivery it
//! hands out. The internal crossbeam channel is not part of the API.

use crate::clock::ms_to_system_time;
use crate::engine::Shared;
use crate::error::{AckError, RecvError};
use crate::task::TaskId;
use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// A task handed to a consumer. Acknowledge it with [`Consumer::ack`] once
/// handled; a delivery never acknowledged is delivered again after a restart
/// (at-least-once), with [`Delivery::attempt`] raised.
#[derive(Clone)]
pub struct Delivery {
    /// The engine instance that made it; only that one accepts its ack.
    pub(crate) engine_id: u64,
    pub(crate) task_id: TaskId,
    pub(crate) slot: u32,
    pub(crate) key: Box<[u8]>,
    pub(crate) payload: Vec<u8>,
    pub(crate) due_ms: u64,
    pub(crate) fired_ms: u64,
    pub(crate) attempt: u32,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("task_id", &self.task_id)
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("payload_bytes", &self.payload.len())
            .field("due_ms", &self.due_ms)
            .field("fired_ms", &self.fired_ms)
            .field("attempt", &self.attempt)
            .finish()
    }
}

impl Delivery {
    /// The engine-assigned id of the task.
    pub fn task_id(&self) -> TaskId {
        self.task_id
    }
    /// The caller-chosen key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }
    /// The payload bytes.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }
    /// The due time, UTC milliseconds since the Unix epoch.
    pub fn due_ms(&self) -> u64 {
        self.due_ms
    }
    /// The due time.
    pub fn due(&self) -> SystemTime {
        ms_to_system_time(self.due_ms)
    }
    /// Wall time at which the driver handed the task out, UTC ms.
    pub fn fired_ms(&self) -> u64 {
        self.fired_ms
    }
    /// How late the hand-out was: `fired − due`, zero if on time. A task that
    /// fell due while the engine was closed shows the downtime here.
    pub fn lateness(&self) -> Duration {
        Duration::from_millis(self.fired_ms.saturating_sub(self.due_ms))
    }
    /// 1 for the first delivery, 2 for the first redelivery, …
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

/// A handle for receiving due tasks. Clone it freely: any number of consumer
/// threads may receive, and each delivery goes to exactly one of them.
#[derive(Clone)]
pub struct Consumer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) rx: Receiver<Delivery>,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("ready", &self.rx.len())
            .finish()
    }
}

impl Consumer {
    /// Blocks until a task is delivered.
    ///
    /// # Errors
    /// [`RecvError::Closed`] once the engine is shut down (or dropped) and
    /// nothing is left; [`RecvError::Poisoned`] if it stopped after an I/O
    /// failure.
    pub fn recv(&self) -> Result<Delivery, RecvError> {
        self.rx.recv().map_err(|_| self.stopped_error())
    }

    /// Like [`Consumer::recv`], giving up after `timeout` with
    /// [`RecvError::Timeout`].
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Delivery, RecvError> {
        self.rx.recv_timeout(timeout).map_err(|e| match e {
            RecvTimeoutError::Timeout => RecvError::Timeout,
            RecvTimeoutError::Disconnected => self.stopped_error(),
        })
    }

    /// Returns a ready task without blocking, or [`RecvError::Empty`].
    pub fn try_recv(&self) -> Result<Delivery, RecvError> {
        self.rx.try_recv().map_err(|e| match e {
            TryRecvError::Empty => RecvError::Empty,
            TryRecvError::Disconnected => self.stopped_error(),
        })
    }

    /// A blocking iterator over deliveries; it ends when the engine stops.
    pub fn iter(&self) -> impl Iterator<Item = Delivery> + '_ {
        std::iter::from_fn(move || self.recv().ok())
    }

    /// Acknowledges a delivery: the task is finished and will not be
    /// delivered again. Under `Durability::Sync` the ack is durable when this
    /// returns. Same as [`crate::Engine::ack`].
    pub fn ack(&self, delivery: &Delivery) -> Result<(), AckError> {
        self.shared.ack_many(std::slice::from_ref(delivery))
    }

    /// Acknowledges many deliveries with one log write. Same as
    /// [`crate::Engine::ack_many`].
    pub fn ack_many(&self, deliveries: &[Delivery]) -> Result<(), AckError> {
        self.shared.ack_many(deliveries)
    }

    /// Deliveries waiting in the engine's ready queue.
    pub fn ready(&self) -> usize {
        self.rx.len()
    }

    fn stopped_error(&self) -> RecvError {
        match self.shared.poison_cause() {
            Some(cause) => RecvError::Poisoned { cause },
            None => RecvError::Closed,
        }
    }
}
