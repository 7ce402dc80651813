//! The log handle and its writer.
use std::path::Path;
use std::sync::Arc;

use crate::{Durability, Lsn, Record, RecordView, RecoveryReport, ReplayError, Storage, WalError, WalOptions};

/// The write-ahead log.
pub struct Wal {
    _p: (),
}

impl Wal {
    /// Opens the log.
    pub fn open(
        storage: Arc<dyn Storage>,
        dir: &Path,
        options: WalOptions,
        replay: &mut dyn FnMut(RecordView<'_>) -> Result<(), ReplayError>,
    ) -> Result<(Wal, RecoveryReport), WalError> {
        let _ = (storage, dir, options, replay);
        unimplemented!()
    }
    /// Appends one atomic frame.
    pub fn append(&self, records: &[Record<'_>]) -> Result<AppendTicket, WalError> {
        let _ = records;
        unimplemented!()
    }
    /// Mode.
    pub fn durability(&self) -> Durability {
        unimplemented!()
    }
    /// Last LSN.
    pub fn last_lsn(&self) -> Lsn {
        unimplemented!()
    }
    /// Poisoned.
    pub fn poisoned(&self) -> Option<String> {
        unimplemented!()
    }
    /// Sync.
    pub fn sync(&self) -> Result<(), WalError> {
        unimplemented!()
    }
    /// Close.
    pub fn close(self) -> Result<(), WalError> {
        unimplemented!()
    }
}

/// Ticket.
#[must_use]
pub struct AppendTicket {
    _p: (),
}

impl AppendTicket {
    /// First.
    pub fn first_lsn(&self) -> Lsn {
        unimplemented!()
    }
    /// Last.
    pub fn last_lsn(&self) -> Lsn {
        unimplemented!()
    }
    /// Wait.
    pub fn wait(self) -> Result<(), WalError> {
        unimplemented!()
    }
}
