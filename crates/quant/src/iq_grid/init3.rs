//! Search structures for IQ3_XXS / IQ3_S quantization, built once per grid and shared across threads:
//! the grid points, a map from every 4-tuple of 3-bit levels to its grid index, and for each tuple off
//! the grid its nearest grid points (`iq3xs_init_impl` and `iq3_find_best_neighbour` in ggml-quants.c).

use super::grids3::{KGRID_256, KGRID_512};
use std::sync::OnceLock;

/// Number of 4-tuples of 3-bit levels (4 × 3 bits).
const KMAP_SIZE: usize = 4096;

/// Where a 4-tuple of levels lands.
#[derive(Clone, Copy, Debug)]
pub(crate) enum MapEntry {
    /// The tuple is a grid point: its index.
    OnGrid(u16),
    /// Off the grid: its candidate neighbours are `neighbours[start..start + len]`.
    Off { start: u32, len: u16 },
}

/// One grid's search structures (ggml's `iq3_entry_t`).
pub(crate) struct Iq3Tables {
    /// Grid points as the odd values 2l+1 (l = 0..7), as ggml's quantizer sees them.
    pub grid: Vec<[i8; 4]>,
    map: Vec<MapEntry>,
    neighbours: Vec<u16>,
}

impl Iq3Tables {
    /// The map entry of the levels packed as `u = l0 | l1 << 3 | l2 << 6 | l3 << 9`.
    #[inline]
    pub fn lookup(&self, u: usize) -> MapEntry {
        self.map[u]
    }

    /// The neighbour list of an off-grid entry.
    #[inline]
    pub fn neighbours(&self, start: u32, len: u16) -> &[u16] {
        &self.neighbours[start as usize..start as usize + len as usize]
    }
}

/// The tables for the 256-point (IQ3_XXS) or 512-point (IQ3_S) grid (`iq3xs_init_impl(grid_size)`).
pub(crate) fn iq3_tables(grid_size: usize) -> &'static Iq3Tables {
    static T256: OnceLock<Iq3Tables> = OnceLock::new();
    static T512: OnceLock<Iq3Tables> = OnceLock::new();
    match grid_size {
        256 => T256.get_or_init(|| build(&KGRID_256, 2)),
        512 => T512.get_or_init(|| build(&KGRID_512, 3)),
        _ => panic!("iq3 grid size must be 256 or 512, not {grid_size}"),
    }
}

/// The four odd values 2l+1 of packed 3-bit levels.
fn point(packed: usize) -> [i8; 4] {
    std::array::from_fn(|k| (2 * ((packed >> (3 * k)) & 7) + 1) as i8)
}

/// Builds the grid, the map and the neighbour lists (`iq3xs_init_impl`). For each tuple off the grid,
/// the neighbours are all grid points within the `nwant` smallest distinct squared distances, ordered
/// by distance then index (the order of ggml's qsort with `iq3_compare_func`).
fn build(kgrid: &[u16], nwant: usize) -> Iq3Tables {
    let grid: Vec<[i8; 4]> = kgrid.iter().map(|&g| point(g as usize)).collect();
    let mut on_grid: Vec<Option<u16>> = vec![None; KMAP_SIZE];
    for (i, &g) in kgrid.iter().enumerate() {
        on_grid[g as usize] = Some(i as u16);
    }
    let mut map = Vec::with_capacity(KMAP_SIZE);
    let mut neighbours = Vec::new();
    let mut dist2: Vec<(i32, u16)> = Vec::with_capacity(grid.len());
    for (u, on) in on_grid.iter().enumerate() {
        if let Some(i) = *on {
            map.push(MapEntry::OnGrid(i));
            continue;
        }
        let pos = point(u);
        dist2.clear();
        dist2.extend(grid.iter().enumerate().map(|(j, pg)| {
            let d2: i32 = (0..4).map(|k| (pg[k] as i32 - pos[k] as i32).pow(2)).sum();
            (d2, j as u16)
        }));
        dist2.sort_unstable();
        let start = neighbours.len() as u32;
        let mut d2 = dist2[0].0;
        let mut nhave = 1;
        for &(d, j) in &dist2 {
            if d > d2 {
                if nhave == nwant {
                    break;
                }
                d2 = d;
                nhave += 1;
            }
            neighbours.push(j);
        }
        let len = (neighbours.len() as u32 - start) as u16;
        map.push(MapEntry::Off { start, len });
    }
    Iq3Tables { grid, map, neighbours }
}

/// Among `neighbours`, the grid point nearest to `xval` at `scale` under `weight`; writes its levels
/// into `l` and returns its index (`iq3_find_best_neighbour`). The first of equal distances wins.
pub(crate) fn iq3_find_best_neighbour(
    neighbours: &[u16],
    grid: &[[i8; 4]],
    xval: &[f32],
    weight: &[f32],
    scale: f32,
    l: &mut [i8],
) -> usize {
    assert!(!neighbours.is_empty());
    let mut best_d2 = f32::MAX;
    let mut best: Option<usize> = None;
    for &j in neighbours {
        let pg = &grid[j as usize];
        let mut d2 = 0f32;
        for i in 0..4 {
            let diff = scale * pg[i] as f32 - xval[i];
            d2 += weight[i] * diff * diff;
        }
        if d2 < best_d2 {
            best_d2 = d2;
            best = Some(j as usize);
        }
    }
    let best = best.expect("iq3_find_best_neighbour: no neighbour closer than f32::MAX");
    for (li, &p) in l[..4].iter_mut().zip(&grid[best]) {
        *li = (p - 1) / 2;
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_covers_every_tuple() {
        for (size, nwant) in [(256usize, 2usize), (512, 3)] {
            let t = iq3_tables(size);
            assert_eq!(t.grid.len(), size);
            let mut on = 0;
            for u in 0..KMAP_SIZE {
                match t.lookup(u) {
                    MapEntry::OnGrid(i) => {
                        on += 1;
                        assert_eq!(t.grid[i as usize], point(u));
                    }
                    MapEntry::Off { start, len } => {
                        let n = t.neighbours(start, len);
                        assert!(!n.is_empty());
                        let p = point(u);
                        let d = |j: u16| -> i32 {
                            (0..4)
                                .map(|k| (t.grid[j as usize][k] as i32 - p[k] as i32).pow(2))
                                .sum()
                        };
                        let mut distinct: Vec<i32> = n.iter().map(|&j| d(j)).collect();
                        assert!(distinct.windows(2).all(|w| w[0] <= w[1]));
                        distinct.dedup();
                        assert!(distinct.len() <= nwant);
                    }
                }
            }
            assert_eq!(on, size);
        }
    }
}
