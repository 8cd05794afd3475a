//! The one bounded map of request ids the proxy keeps: requests waiting for their answers,
//! and ids remembered for a while after (answered with the proxy's own error, cancelled,
//! taken by the broker). Keyed by [`RequestId`], so that every such map pairs ids the one
//! way the peers might, and bounded by a limit from `limits.rs`, so that no peer can make
//! the proxy remember without end.

use std::collections::{BTreeMap, HashMap};

use super::lenient::RequestId;

/// Values by [`RequestId`], at most `limit` of them, the oldest let go first.
///
/// Where letting go of the oldest would lose something owed (a request waiting for its
/// answer), the caller asks [`PendingIds::has_room_for`] first and refuses the new one
/// instead.
pub(crate) struct PendingIds<V> {
    entries: HashMap<RequestId, (u64, V)>,
    /// The entries by age: the number each was inserted under.
    order: BTreeMap<u64, RequestId>,
    next: u64,
    limit: usize,
}

impl<V> PendingIds<V> {
    /// An empty map of at most `limit` entries (at least one).
    pub(crate) fn new(limit: usize) -> PendingIds<V> {
        PendingIds {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            next: 0,
            limit: limit.max(1),
        }
    }

    /// Whether `id` can be inserted without letting another go: there is room, or `id` is
    /// there already.
    pub(crate) fn has_room_for(&self, id: &RequestId) -> bool {
        self.entries.len() < self.limit || self.entries.contains_key(id)
    }

    /// `value` under `id`, as the newest entry (in place of what `id` had). When that makes
    /// one too many, the oldest is let go, and returned.
    pub(crate) fn insert(&mut self, id: RequestId, value: V) -> Option<(RequestId, V)> {
        let age = self.next;
        self.next += 1;
        if let Some((old, _)) = self.entries.insert(id.clone(), (age, value)) {
            self.order.remove(&old);
        }
        self.order.insert(age, id);
        if self.entries.len() <= self.limit {
            return None;
        }
        let (_, oldest) = self.order.pop_first()?;
        let (_, value) = self.entries.remove(&oldest)?;
        Some((oldest, value))
    }

    /// The entry of `id`, taken out.
    pub(crate) fn remove(&mut self, id: &RequestId) -> Option<V> {
        let (age, value) = self.entries.remove(id)?;
        self.order.remove(&age);
        Some(value)
    }

    /// The value under `id`.
    pub(crate) fn get(&self, id: &RequestId) -> Option<&V> {
        self.entries.get(id).map(|(_, v)| v)
    }

    /// The value under `id`, to change.
    pub(crate) fn get_mut(&mut self, id: &RequestId) -> Option<&mut V> {
        self.entries.get_mut(id).map(|(_, v)| v)
    }

    /// Whether `id` has an entry.
    pub(crate) fn contains(&self, id: &RequestId) -> bool {
        self.entries.contains_key(id)
    }

    /// How many entries there are.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Every entry, in no order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&RequestId, &V)> {
        self.entries.iter().map(|(id, (_, v))| (id, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u32) -> RequestId {
        RequestId::parse(n.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn the_oldest_goes_first_and_a_respelled_id_is_the_same_entry() {
        let mut ids = PendingIds::new(3);
        for n in 1..=3 {
            assert!(ids.insert(id(n), n).is_none());
        }
        assert!(!ids.has_room_for(&id(4)));
        assert!(ids.has_room_for(&id(2)));
        // Inserted again: the newest, so 1 and then 3 go before it.
        let again = RequestId::parse(b"\"2.0\"").unwrap();
        assert!(ids.insert(again, 20).is_none());
        assert_eq!(ids.insert(id(4), 4), Some((id(1), 1)));
        assert_eq!(ids.insert(id(5), 5), Some((id(3), 3)));
        assert_eq!(ids.get(&id(2)), Some(&20));
        assert_eq!(ids.remove(&RequestId::parse(b"2e0").unwrap()), Some(20));
        assert!(!ids.contains(&id(2)));
        assert_eq!(ids.len(), 2);
        *ids.get_mut(&id(4)).unwrap() = 40;
        assert_eq!(ids.insert(id(6), 6), None);
        assert_eq!(ids.insert(id(7), 7), Some((id(4), 40)));
        let mut left: Vec<u32> = ids.iter().map(|(_, v)| *v).collect();
        left.sort();
        assert_eq!(left, [5, 6, 7]);
    }
}
