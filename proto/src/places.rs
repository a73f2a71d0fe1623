//! The client's side of `StreamEventsRequest.places_once`: the places a
//! stream has sent, by number, and each later location filled in from
//! them.

use std::collections::HashMap;

use crate::v1::{Hit, Location, StreamEventsResponse, stream_events_response::Event};

/// Places a stream sends before it starts over: the daemon forgets the
/// places a stream has had when they reach this many, before the next hit
/// with numbered places (whose places then carry their fields again), and
/// a client forgets its own at the same hit, so that neither end keeps
/// more than this per stream however long it runs.
pub const PLACES_PER_STREAM: usize = 65_536;

/// The places one stream has sent (one per stream: numbers are the
/// stream's own).
#[derive(Debug, Default, Clone)]
pub struct Places {
    known: HashMap<u64, Location>,
}

impl Places {
    /// An empty set, for a new stream.
    pub fn new() -> Places {
        Places::default()
    }

    /// How many places the stream has sent.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// Whether the stream has sent none.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// Fills in `loc` from the place it names, or keeps its fields when it
    /// is the first with its number. A location without a number (a
    /// replayed record, a stream without `places_once`) is left as it is;
    /// so is one naming a number never sent, which only a stream other
    /// than this set's can give.
    pub fn fill(&mut self, loc: &mut Location) {
        if loc.place_id == 0 {
            return;
        }
        match self.known.get(&loc.place_id) {
            Some(known) => {
                let (ip, lookup, id) = (loc.ip, loc.lookup_address, loc.place_id);
                loc.clone_from(known);
                loc.ip = ip;
                loc.lookup_address = lookup;
                loc.place_id = id;
            }
            None => {
                self.known.insert(loc.place_id, loc.clone());
            }
        }
    }

    /// Fills in every location of `ev` (a hit's place and backtrace).
    pub fn fill_event(&mut self, ev: &mut StreamEventsResponse) {
        if let Some(Event::Hit(h)) = &mut ev.event {
            self.fill_hit(h);
        }
    }

    /// Fills in every location of a hit of the stream (its place and
    /// backtrace): every hit, in the stream's order, shown or not, since
    /// a place's fields come with its first hit only.
    pub fn fill_hit(&mut self, h: &mut Hit) {
        let numbered = h
            .location
            .iter()
            .chain(&h.backtrace)
            .any(|l| l.place_id != 0);
        if numbered && self.known.len() >= PLACES_PER_STREAM {
            // Where the daemon started over for this stream.
            self.known.clear();
        }
        if let Some(loc) = &mut h.location {
            self.fill(loc);
        }
        for loc in &mut h.backtrace {
            self.fill(loc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(id: u64, ip: u64) -> Location {
        Location {
            ip,
            lookup_address: ip - 1,
            function: "conn_new".into(),
            function_offset: 12,
            file: "conn.c".into(),
            line: 42,
            module: "/usr/bin/server".into(),
            build_id: vec![1, 2, 3],
            module_address: 0x1234,
            file_offset: 0x234,
            has_file_offset: true,
            place_id: id,
            ..Default::default()
        }
    }

    #[test]
    fn a_place_sent_once_fills_the_locations_naming_it() {
        let mut p = Places::new();
        let mut first = full(7, 0x401000);
        p.fill(&mut first);
        assert_eq!(first, full(7, 0x401000));
        let mut later = Location {
            ip: 0x401000,
            lookup_address: 0x400fff,
            place_id: 7,
            ..Default::default()
        };
        p.fill(&mut later);
        assert_eq!(later, full(7, 0x401000));
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn locations_without_a_number_or_with_an_unknown_one_stay_as_they_are() {
        let mut p = Places::new();
        let mut plain = full(0, 0x401000);
        p.fill(&mut plain);
        assert_eq!(plain, full(0, 0x401000));
        assert!(p.is_empty());
        let mut ev = StreamEventsResponse {
            event: Some(Event::Hit(crate::v1::Hit {
                location: Some(full(3, 0x10)),
                backtrace: vec![
                    Location {
                        ip: 0x10,
                        lookup_address: 0xf,
                        place_id: 3,
                        ..Default::default()
                    },
                    full(4, 0x20),
                ],
                ..Default::default()
            })),
            ..Default::default()
        };
        p.fill_event(&mut ev);
        let Some(Event::Hit(h)) = &ev.event else {
            unreachable!()
        };
        assert_eq!(h.backtrace[0], full(3, 0x10));
        assert_eq!(p.len(), 2);
    }
}
