//! The Zipf workload of row 23: its objects and their sizes, the origin's files of it, the cache
//! room every server gets (a tenth of the set), and the requests (the same for every server).

use std::path::Path;

use crate::util::pattern;

/// Zipf workload (row 23): objects, their sizes, the exponent, requests.
pub(crate) const ZIPF_OBJECTS: usize = 2_000;
pub(crate) const ZIPF_CLASSES: usize = 16;
pub(crate) const ZIPF_S: f64 = 1.0;
pub(crate) const ZIPF_WARM: usize = 4_000;
pub(crate) const ZIPF_MEASURED: usize = 8_000;

/// The size class of Zipf object `rank` (0 to 15: 512 KiB to 1,952 KiB).
pub(crate) fn zipf_class(rank: usize) -> usize {
    (rank.wrapping_mul(2_654_435_761) >> 7) % ZIPF_CLASSES
}

pub(crate) fn zipf_class_bytes(class: usize) -> usize {
    (512 + 96 * class) << 10
}

/// The cache room of row 23, for every server: a tenth of the Zipf set, in MiB.
pub(crate) fn zipf_room_mib() -> u64 {
    let set: usize = (0..ZIPF_OBJECTS)
        .map(|r| zipf_class_bytes(zipf_class(r)))
        .sum();
    (set as u64 / 10) >> 20
}

/// The Zipf files of the origin, `zipf/CLASS.bin`, under `www`.
pub(crate) fn make_zipf_content(www: &Path, write: impl Fn(&Path, &[u8])) {
    for class in 0..ZIPF_CLASSES {
        write(
            &www.join(format!("zipf/{class}.bin")),
            &pattern(zipf_class_bytes(class)),
        );
    }
}

/// The requests of row 23: ranks drawn from Zipf(`ZIPF_S`) over `ZIPF_OBJECTS` with a fixed
/// seed, the same sequence for every server.
pub(crate) fn zipf_sequence(n: usize) -> Vec<usize> {
    let weights: Vec<f64> = (1..=ZIPF_OBJECTS)
        .map(|k| 1.0 / (k as f64).powf(ZIPF_S))
        .collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(ZIPF_OBJECTS);
    let mut acc = 0.0;
    for w in weights {
        acc += w / total;
        cdf.push(acc);
    }
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            cdf.partition_point(|&c| c < u).min(ZIPF_OBJECTS - 1)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn the_zipf_requests_are_the_same_for_every_server_and_follow_the_law() {
        let a = zipf_sequence(20_000);
        assert_eq!(a, zipf_sequence(20_000));
        let count = |rank: usize| a.iter().filter(|&&r| r == rank).count() as f64;
        // P(rank k) = (1/k) / H(2000), H(2000) ≈ 8.18: the first about 12 %, the second half of it.
        let first = count(0) / a.len() as f64;
        assert!((0.11..0.135).contains(&first), "{first}");
        let half = count(1) / count(0);
        assert!((0.42..0.58).contains(&half), "{half}");
        assert!(a.iter().all(|&r| r < ZIPF_OBJECTS));
    }

    #[test]
    fn the_zipf_set_spans_half_a_mebibyte_to_two_and_the_room_is_a_tenth() {
        assert_eq!(zipf_class_bytes(0), 512 << 10);
        assert_eq!(zipf_class_bytes(ZIPF_CLASSES - 1), 1952 << 10);
        let classes: BTreeSet<usize> = (0..ZIPF_OBJECTS).map(zipf_class).collect();
        assert_eq!(classes.len(), ZIPF_CLASSES);
        let set_mib = (0..ZIPF_OBJECTS)
            .map(|r| zipf_class_bytes(zipf_class(r)) as u64)
            .sum::<u64>()
            >> 20;
        assert_eq!(zipf_room_mib(), set_mib / 10);
    }
}
