//! What a watch reports: the three changes servers hear of, the set a watch asks for, and how
//! a burst of changes to one path folds into one notification.

use crate::error::{Error, Result};

/// Events a watch reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EventSet {
    /// `created`
    pub created: bool,
    /// `modified`
    pub modified: bool,
    /// `deleted`
    pub deleted: bool,
}

impl EventSet {
    /// All three.
    pub(crate) const ALL: EventSet = EventSet {
        created: true,
        modified: true,
        deleted: true,
    };

    /// From the wire names; an unknown name is an error naming it.
    pub(crate) fn parse(names: &[String]) -> Result<EventSet> {
        let mut set = EventSet {
            created: false,
            modified: false,
            deleted: false,
        };
        for n in names {
            match n.as_str() {
                "created" => set.created = true,
                "modified" => set.modified = true,
                "deleted" => set.deleted = true,
                other => {
                    return Err(Error::invalid_params(format!(
                        "unknown event {other:?}: expected \"created\", \"modified\" or \"deleted\""
                    )));
                }
            }
        }
        if !(set.created || set.modified || set.deleted) {
            return Err(Error::invalid_params("events must name at least one event"));
        }
        Ok(set)
    }

    pub(super) fn has(&self, e: Change) -> bool {
        match e {
            Change::Created => self.created,
            Change::Modified => self.modified,
            Change::Deleted => self.deleted,
        }
    }
}

/// A change as reported to servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// The path appeared (created, or moved in).
    Created,
    /// Its content or metadata changed.
    Modified,
    /// The path went away (deleted, or moved out).
    Deleted,
}

impl Change {
    pub(super) fn name(self) -> &'static str {
        match self {
            Change::Created => "created",
            Change::Modified => "modified",
            Change::Deleted => "deleted",
        }
    }

    /// Two changes to one path within the coalescing window, as one.
    pub(super) fn then(self, next: Change) -> Change {
        match (self, next) {
            (Change::Created, Change::Modified) => Change::Created,
            (Change::Deleted, Change::Created) => Change::Modified,
            (_, next) => next,
        }
    }
}
