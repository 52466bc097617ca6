//! The search structures of ggml's `iq2xs_init_impl` (`ggml/src/ggml-quants.c`): for each of the
//! four grids (IQ2_XXS, IQ2_XS, IQ2_S, and the one IQ1_S and IQ1_M share) the grid points, a map
//! from every 2-bit-per-coordinate point to its grid index, and, for points off the grid, the list
//! of grid points in the nearest distance shells. Built once per grid and shared by all threads.

use super::grids2::{KGRID_1BIT_2048, KGRID_2BIT_1024, KGRID_2BIT_256, KGRID_2BIT_512};
use rayon::prelude::*;
use std::sync::OnceLock;

/// Which of `iq2xs_init_impl`'s four grids (`iq2_data_index`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Iq2Grid {
    /// IQ2_XXS: 256 points.
    Xxs,
    /// IQ2_XS: 512 points.
    Xs,
    /// IQ1_S and IQ1_M: 2048 points.
    Iq1,
    /// IQ2_S: 1024 points.
    S,
}

/// Points with coordinates packed 2 bits each span `0..KMAP_SIZE` (`kmap_size`).
const KMAP_SIZE: usize = 43692;

/// One grid's tables (`iq2_entry_t`).
pub(crate) struct Iq2Data {
    /// Grid points, coordinate `l` stored as `2*l + 1` (`the_grid`).
    pub grid: Vec<[i8; 8]>,
    /// Grid index of each packed point, or `-(offset + 1)` into `neighbours` when off the grid.
    pub map: Vec<i32>,
    /// For each off-grid point: a count followed by that many grid indices.
    neighbours: Vec<u16>,
    /// Parallel to `neighbours`: each neighbour's packed 2-bit coordinates (its `kgrid` entry; 0 at
    /// the count slots), then `PACKED_PAD` zeros so that 8-wide loads never run past the end.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // read by the AVX2 search
    neighbours_packed: Vec<u16>,
}

/// Zeros after the last list of `neighbours_packed`.
const PACKED_PAD: usize = 8;

impl Iq2Data {
    /// Grid index of the packed point `u`, or `None` when it is off the grid.
    #[inline]
    pub fn index_of(&self, u: u16) -> Option<usize> {
        let m = self.map[u as usize];
        (m >= 0).then_some(m as usize)
    }

    /// Neighbour list of the off-grid packed point `u` (`kneighbors_q2xs - kmap_q2xs[u] - 1`).
    #[inline]
    pub fn neighbours(&self, u: u16) -> &[u16] {
        let m = self.map[u as usize];
        debug_assert!(m < 0);
        let start = (-(m + 1)) as usize;
        let n = self.neighbours[start] as usize;
        &self.neighbours[start + 1..start + 1 + n]
    }

    /// The packed 2-bit coordinates of the neighbours of `u` (same order as [`Self::neighbours`]),
    /// followed by at least 7 more readable entries (from the next lists or padding) for 8-wide loads.
    #[inline]
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn neighbours_packed(&self, u: u16) -> &[u16] {
        let m = self.map[u as usize];
        debug_assert!(m < 0);
        let start = (-(m + 1)) as usize;
        let n = self.neighbours[start] as usize;
        &self.neighbours_packed[start + 1..start + 1 + n + PACKED_PAD - 1]
    }
}

/// The tables for `which`, built on first use (`iq2xs_init_impl`).
pub(crate) fn iq2_data(which: Iq2Grid) -> &'static Iq2Data {
    static DATA: [OnceLock<Iq2Data>; 4] = [OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let slot = match which {
        Iq2Grid::Xxs => 0,
        Iq2Grid::Xs => 1,
        Iq2Grid::Iq1 => 2,
        Iq2Grid::S => 3,
    };
    DATA[slot].get_or_init(|| build(which))
}

/// Unpack 2-bit coordinates into lattice values `2*l + 1`.
fn unpack(packed: usize) -> [i8; 8] {
    std::array::from_fn(|k| (2 * ((packed >> (2 * k)) & 3) + 1) as i8)
}

/// `iq2xs_init_impl`: grid, map, and neighbour lists. The neighbours of an off-grid point are all
/// grid points in its `nwant` nearest distance shells, ordered by (squared distance, grid index),
/// which is the order ggml's qsort with `iq2_compare_func` (a total order) produces.
fn build(which: Iq2Grid) -> Iq2Data {
    let (kgrid, nwant): (&[u16], usize) = match which {
        Iq2Grid::Xxs => (&KGRID_2BIT_256, 2),
        Iq2Grid::Xs => (&KGRID_2BIT_512, 2),
        Iq2Grid::Iq1 => (&KGRID_1BIT_2048, 3),
        Iq2Grid::S => (&KGRID_2BIT_1024, 1),
    };
    let grid: Vec<[i8; 8]> = kgrid.iter().map(|&g| unpack(g as usize)).collect();
    let mut map = vec![-1i32; KMAP_SIZE];
    for (i, p) in grid.iter().enumerate() {
        let index = p
            .iter()
            .enumerate()
            .fold(0usize, |acc, (k, &v)| acc | ((((v - 1) / 2) as usize) << (2 * k)));
        map[index] = i as i32;
    }

    // Largest squared distance between two points with coordinates in {1, 3, 5, 7}: 8 * 6^2.
    const MAX_D2: usize = 8 * 36;
    let lists: Vec<Vec<u16>> = (0..KMAP_SIZE)
        .into_par_iter()
        .map(|i| {
            if map[i] >= 0 {
                return Vec::new();
            }
            let pos = unpack(i);
            let d2: Vec<u16> = grid
                .iter()
                .map(|pg| {
                    pg.iter()
                        .zip(&pos)
                        .map(|(&a, &b)| {
                            let d = (a - b) as i32;
                            (d * d) as u16
                        })
                        .sum()
                })
                .collect();
            let mut present = [false; MAX_D2 + 1];
            for &d in &d2 {
                present[d as usize] = true;
            }
            let shells: Vec<u16> = (0..=MAX_D2 as u16)
                .filter(|&d| present[d as usize])
                .take(nwant)
                .collect();
            let mut list = vec![0u16];
            for &shell in &shells {
                list.extend(
                    d2.iter()
                        .enumerate()
                        .filter(|&(_, &d)| d == shell)
                        .map(|(j, _)| j as u16),
                );
            }
            list[0] = (list.len() - 1) as u16;
            list
        })
        .collect();

    let total: usize = lists.iter().map(Vec::len).sum();
    let mut neighbours = Vec::with_capacity(total);
    let mut neighbours_packed = Vec::with_capacity(total + PACKED_PAD);
    for (i, list) in lists.iter().enumerate() {
        if map[i] < 0 {
            map[i] = -(neighbours.len() as i32 + 1);
            neighbours.extend_from_slice(list);
            neighbours_packed.push(0);
            neighbours_packed.extend(list[1..].iter().map(|&j| kgrid[j as usize]));
        }
    }
    neighbours_packed.resize(neighbours_packed.len() + PACKED_PAD, 0);
    Iq2Data {
        grid,
        map,
        neighbours,
        neighbours_packed,
    }
}

/// `iq2_find_best_neighbour`: among the neighbours of an off-grid point, the grid point closest
/// (weighted) to `xval / scale`; writes its levels into `l` and returns its index.
pub(crate) fn iq2_find_best_neighbour(
    neighbours: &[u16],
    grid: &[[i8; 8]],
    xval: &[f32],
    weight: &[f32],
    scale: f32,
    l: &mut [i8],
) -> usize {
    assert!(!neighbours.is_empty(), "iq2_find_best_neighbour: no neighbours");
    let mut best_d2 = f32::MAX;
    let mut grid_index = None;
    for &j in neighbours {
        let pg = &grid[j as usize];
        let mut d2 = 0f32;
        for i in 0..8 {
            let q = pg[i] as f32;
            let diff = scale * q - xval[i];
            d2 += weight[i] * diff * diff;
        }
        if d2 < best_d2 {
            best_d2 = d2;
            grid_index = Some(j as usize);
        }
    }
    let grid_index = grid_index.expect("iq2_find_best_neighbour: no grid point found (ggml aborts here)");
    for (li, &g) in l.iter_mut().zip(&grid[grid_index]) {
        *li = (g - 1) / 2;
    }
    grid_index
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_are_consistent() {
        for which in [Iq2Grid::Xxs, Iq2Grid::Xs, Iq2Grid::S, Iq2Grid::Iq1] {
            let d = iq2_data(which);
            for u in 0..KMAP_SIZE as u16 {
                match d.index_of(u) {
                    Some(g) => assert_eq!(unpack(u as usize), d.grid[g]),
                    None => {
                        let n = d.neighbours(u);
                        assert!(!n.is_empty());
                        let packed = d.neighbours_packed(u);
                        assert_eq!(packed.len(), n.len() + 7);
                        for (&j, &p) in n.iter().zip(packed) {
                            assert_eq!(unpack(p as usize), d.grid[j as usize]);
                        }
                    }
                }
            }
        }
    }
}
