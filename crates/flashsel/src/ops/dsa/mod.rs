//! `dsa_scores` and `dsa_indexer`: the DeepSeek-V3.2 (DSA) lightning
//! indexer's logits over per-query key ranges, and the exact top-k of them
//! as token ids or KV slots. The logits follow DeepGEMM's `fp8_mqa_logits`
//! (`../shared/reference/selection-stage.md` section 2); the selection is
//! [`select_ranges`](crate::cpu::select_ranges)' (flashsel's contract:
//! ties to the lower id, the NaN policy). `docs/semantics.md` ("DSA indexer
//! scores") states the same contract in prose.
//!
//! # Contract
//! Query row `t` has `H` index heads `q[t, h, 0..d]` (`1 <= H <= 128`, `d`
//! in {64, 128, 256}; DeepSeek-V3.2: 64 heads of 128) and one weight per
//! head `w[t, h]` (f32; the model's head weights with the query scales and
//! `1/sqrt(d)` folded in); key `s` is `k[s, 0..d]` (one shared key head)
//! with an optional f32 scale `k_scale[s]` (the fp8 cache's per-token
//! scale; absent: 1). Row `t` scores the keys of its half-open range
//! `[starts[t], ends[t])` (`0 <= starts[t] <= ends[t] <= N`):
//!
//! ```text
//! score[t, s] = k_scale[s] * sum over h of w[t, h] * relu(q[t, h, :] . k[s, :])   starts[t] <= s < ends[t]
//! score[t, s] = -inf                                                              otherwise
//! ```
//!
//! (ReLU is positively homogeneous, so a positive per-token scale may
//! multiply after it, as DeepGEMM's kernels do.) `q` and `k` are f32, bf16
//! or fp8 e4m3 ([`F8E4M3`], no scale of their own: fold q's into `w`).
//!
//! ```
//! use flashsel::ops::dsa::DsaScoresSpec;
//!
//! // One query (2 heads of 64) over 3 keys, range [1, 3).
//! let spec = DsaScoresSpec::new(1, 2, 64, 3);
//! let mut q = vec![0f32; 2 * 64];
//! (q[0], q[64]) = (1.0, -1.0);
//! let mut k = vec![0f32; 3 * 64];
//! (k[64], k[128]) = (2.0, -3.0); // key 1: dots 2, -2; key 2: -3, 3
//! let w = [0.5f32, 2.0];
//! let s = flashsel::cpu::dsa_scores(&q, &k, Some(&[1.0, 1.0, 4.0]), &w, &[1], &[3], &spec)?;
//! assert_eq!(s, [f32::NEG_INFINITY, 1.0, 24.0]); // 0.5 * 2; 4 * (2 * 3)
//! # Ok::<(), flashsel::Error>(())
//! ```
//!
//! # Arithmetic (the CPU engine, bit for bit)
//! Every input is decoded exactly to f32; then in f32 with round-to-nearest
//! and no fused multiply-add:
//! 1. `dot_h = q[t, h, :] . k[s, :]` in the order of `qsa_scores`' dot
//!    product ([`crate::ops::indexer`], step 1: 8 lanes, a fixed tree).
//! 2. `r_h = relu(dot_h)`: `dot_h` if `dot_h > 0`, NaN if NaN, else `+0.0`.
//! 3. `acc = (((+0.0 + w_0 r_0) + w_1 r_1) + ...) + w_{H-1} r_{H-1}`, each
//!    product rounded.
//! 4. `score = acc * k_scale[s]` (with a scale). A NaN score is the quiet
//!    NaN `0x7fc00000`.
//!
//! # Error bound
//! Against the exact value (and the float64 [`reference_dsa_scores`]), for
//! finite inputs without overflow, with `A_h = sum over j of |q[t, h, j] *
//! k[s, j]|` and `M = |k_scale[s]| * sum over h of |w[t, h]| * A_h`:
//!
//! ```text
//! |score[t, s] - exact[t, s]| <= (d + H + 2) * 2^-24 * M + (d + 2) * H * 2^-149 * W
//! ```
//!
//! with `W = max(1, |k_scale[s]|) * max(1, max over h of |w[t, h]|)` (the
//! second term covers underflow): the dot products lose at most `gamma_d
//! A_h`, relu nothing, the weight product and the head sum `gamma_{H + 1}`,
//! the scale one unit ([`error_bound`]). It holds for every order of the
//! sums, with or without fused multiply-adds.
//!
//! # The CUDA engine's order
//! The CUDA engine computes the dot products on tensor cores
//! (kernels/indexer/dsa/score.cuh), so its scores are not the CPU's bits;
//! they are a pure function of the row's and the key's values (the same
//! bits on every run, in any batch, chunk or row group), within
//! [`device_error_bound`] of the exact value:
//! 1. `dot_h`: every value split exactly into bf16 terms (bf16 and e4m3
//!    one, f32 three), the indexers' tensor-core order
//!    (kernels/indexer/common/key_mma.cuh: an f32 accumulator from `+0.0`,
//!    one `mma.sync` m16n8k16 per 16 dimensions and term pair, the tensor
//!    core's own deterministic summation inside each).
//! 2. `p_h = w_h * relu(dot_h)`, rounded; `+0.0` for a head past `H`.
//! 3. The heads in chunks of `C` = 32 (16 with f32 keys; chunk `c` holds
//!    heads `C c ..`): within a chunk, with `P_n = p_{Cc+8n+2i} +
//!    p_{Cc+8n+2i+1}`, lane `i` in 0..4 sums `S_i = ((P_0 + P_1) + P_2) +
//!    ... + P_{C/8-1}` and the chunk's sum is `(S_0 + S_1) + (S_2 + S_3)`;
//!    then `acc = ((+0.0 + chunk_0) + chunk_1) ...`.
//! 4. `score = acc * k_scale[s]` (with a scale), a NaN the quiet NaN
//!    `0x7fc00000`.
//!
//! # The indexer
//! [`dsa_indexer`] selects the top `k` of each row's range of the scores
//! exactly as [`select_ranges`](crate::cpu::select_ranges) does on
//! [`dsa_scores`]' output (the same bytes: it is that chain on the CPU),
//! optionally mapping the ids to KV slots through a page table
//! ([`crate::ops::pages`]). The CUDA engine's indexer is the same chain on
//! its own scores: its ids and values are `select_ranges` of the CUDA
//! engine's `dsa_scores`, byte for byte.

use rayon::prelude::*;

use crate::contract::{try_vec, DType, Error, Result, ScoresView};
use crate::ops::indexer::{dots, relu, KeyElem};
pub use crate::ops::indexer::{F8E4M3, LANES};
use crate::ops::mla::{check_len, product};
use crate::ops::pages::PageMap;
use crate::ops::select::{SelectSpec, Selection};

/// The most index heads a request may have.
pub const MAX_HEADS: usize = 128;
/// The head widths a request may have.
pub const DIMS: [usize; 3] = [64, 128, 256];

/// A `dsa_scores` request: everything but the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DsaScoresSpec {
    /// Queries (`T`).
    pub rows: usize,
    /// Index heads per query (`H`).
    pub heads: usize,
    /// Values per head and per key (`d`).
    pub dim: usize,
    /// Keys (`N`, the scores' columns).
    pub keys: usize,
}

impl DsaScoresSpec {
    pub fn new(rows: usize, heads: usize, dim: usize, keys: usize) -> Self {
        Self { rows, heads, dim, keys }
    }

    /// Elements of the scores: `rows * keys`.
    pub fn out_len(&self) -> Result<usize> {
        self.rows
            .checked_mul(self.keys)
            .ok_or_else(|| Error::Shape(format!("scores [{}, {}] overflow", self.rows, self.keys)))
    }

    /// The shape rules: `1 <= heads <= 128`, `dim` in {64, 128, 256}, `keys`
    /// at most `i32::MAX` (ids are int32), sizes that fit `usize`.
    pub fn validate(&self) -> Result<()> {
        if self.heads == 0 || self.heads > MAX_HEADS {
            return Err(Error::InvalidOption {
                what: "heads (H, q's second dimension)",
                value: self.heads.to_string(),
                expected: "1..=128",
            });
        }
        if !DIMS.contains(&self.dim) {
            return Err(Error::InvalidOption {
                what: "head dim (d, the last dimension of q and k)",
                value: self.dim.to_string(),
                expected: "64, 128 or 256",
            });
        }
        if self.keys > i32::MAX as usize {
            return Err(Error::too_large("keys", self.keys as u128));
        }
        self.out_len()?;
        product("q", &[self.rows, self.heads, self.dim])?;
        Ok(())
    }
}

/// Every check the host makes: the spec, the buffers' lengths, each row's
/// range.
fn check_request(
    spec: &DsaScoresSpec,
    q_len: usize,
    k_len: usize,
    k_scale: Option<&[f32]>,
    weights: &[f32],
    starts: &[i32],
    ends: &[i32],
) -> Result<()> {
    spec.validate()?;
    check_len("q", q_len, spec.rows * spec.heads * spec.dim)?;
    check_len("k", k_len, spec.keys * spec.dim)?;
    if let Some(s) = k_scale {
        check_len("k_scale", s.len(), spec.keys)?;
    }
    check_len("weights", weights.len(), spec.rows * spec.heads)?;
    check_len("starts", starts.len(), spec.rows)?;
    check_len("ends", ends.len(), spec.rows)?;
    for (t, (&a, &b)) in starts.iter().zip(ends).enumerate() {
        if a < 0 || b < a || b as usize > spec.keys {
            return Err(Error::InvalidOption {
                what: "key range",
                value: format!("[{a}, {b}) at row {t}"),
                expected: "0 <= starts[t] <= ends[t] <= keys",
            });
        }
    }
    Ok(())
}

fn decode<E: KeyElem>(v: &[E]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}

/// [`score_row`] at one head width.
type RowFn = fn(&[f32], &[f32], Option<&[f32]>, &[f32], (usize, usize), &dyn Fn(usize) -> usize, &mut [f32]);

/// One row's scores over its range (the contract's arithmetic), `-inf`
/// elsewhere. `q` the row's decoded heads `[H, D]`; key (column) `s` is
/// `k[slot(s)]` with scale `k_scale[slot(s)]`.
fn score_row<const D: usize>(
    q: &[f32],
    k: &[f32],
    k_scale: Option<&[f32]>,
    w: &[f32],
    range: (usize, usize),
    slot: &dyn Fn(usize) -> usize,
    out: &mut [f32],
) {
    out.fill(f32::NEG_INFINITY);
    let heads: Vec<&[f32; D]> = q.chunks_exact(D).map(|h| h.try_into().expect("D values")).collect();
    for (s, o) in out.iter_mut().enumerate().take(range.1).skip(range.0) {
        let at = slot(s);
        let key: &[f32; D] = k[at * D..(at + 1) * D].try_into().expect("D values");
        let mut acc = 0f32;
        for (h, qh) in heads.iter().enumerate() {
            let [dot] = dots::<D, 1>([qh], key);
            acc += w[h] * relu(dot);
        }
        if let Some(sc) = k_scale {
            acc *= sc[at];
        }
        *o = if acc.is_nan() { f32::from_bits(0x7fc0_0000) } else { acc };
    }
}

fn row_fn(d: usize) -> RowFn {
    match d {
        64 => score_row::<64>,
        128 => score_row::<128>,
        _ => score_row::<256>,
    }
}

/// The CPU engine's DSA indexer scores (module docs): `q [T, H, d]`, `k [N,
/// d]`, `k_scale [N]` (optional), `weights [T, H]`, `starts`, `ends [T]`;
/// returns f32 `[T, N]`. Rows run in parallel; a row's bytes do not depend
/// on the batch or the thread count. Row `t` reads only the keys of its
/// range.
pub fn dsa_scores<Q: KeyElem, K: KeyElem>(
    q: &[Q],
    k: &[K],
    k_scale: Option<&[f32]>,
    weights: &[f32],
    starts: &[i32],
    ends: &[i32],
    spec: &DsaScoresSpec,
) -> Result<Vec<f32>> {
    check_request(spec, q.len(), k.len(), k_scale, weights, starts, ends)?;
    let mut out = try_vec("scores", spec.out_len()?, 0f32)?;
    if spec.keys == 0 {
        return Ok(out);
    }
    let kf = decode(k);
    let (h, d) = (spec.heads, spec.dim);
    let f = row_fn(d);
    out.par_chunks_mut(spec.keys).enumerate().for_each(|(t, row)| {
        let qt = decode(&q[t * h * d..(t + 1) * h * d]);
        f(&qt, &kf, k_scale, &weights[t * h..(t + 1) * h], (starts[t] as usize, ends[t] as usize), &|s| s, row);
    });
    Ok(out)
}

/// DeepSeek-V3.2's paged fp8 index-key cache, in DeepGEMM
/// `fp8_paged_mqa_logits`' layout: pages of `page_size` tokens (DeepSeek:
/// 64), each `page_size * d` e4m3 bytes (token `j`'s key at byte `j d`) then
/// `page_size` little-endian f32 scales (token `j`'s at byte `page_size d +
/// 4 j`); `num_pages = cache.len() / (page_size (d + 4))`. Key (column) `s`
/// of row `t` is token `s` of sequence `seq_ids[t]` through the page table
/// ([`PageMap`], whose page size is the cache's), its scale the token's.
#[derive(Debug, Clone, Copy)]
pub struct DsaPagedKeys<'a> {
    pub cache: &'a [u8],
    pub pages: PageMap<'a>,
}

impl DsaPagedKeys<'_> {
    /// Bytes of one page at head width `d`.
    pub fn page_bytes(&self, d: usize) -> usize {
        self.pages.page_size() * (d + 4)
    }
    /// Pages of the cache.
    pub fn num_pages(&self, d: usize) -> usize {
        self.cache.len() / self.page_bytes(d).max(1)
    }
    /// Every check of a paged request beyond [`check_request`]'s: a whole
    /// number of pages, one sequence a row, every page of each row's range
    /// in the table and in the cache.
    pub(crate) fn check(&self, spec: &DsaScoresSpec, starts: &[i32], ends: &[i32]) -> Result<()> {
        let pb = self.page_bytes(spec.dim);
        if !self.cache.len().is_multiple_of(pb) {
            return Err(Error::Shape(format!(
                "the paged key cache holds {} bytes, not a whole number of pages of {pb} ({} tokens of {} e4m3 \
                 bytes and an f32 scale)",
                self.cache.len(),
                self.pages.page_size(),
                spec.dim
            )));
        }
        self.pages.check_rows(spec.rows)?;
        let slots = self.num_pages(spec.dim) * self.pages.page_size();
        for t in 0..spec.rows {
            let (a, b) = (starts[t] as usize, ends[t] as usize);
            self.pages.check_span(t, a, b)?;
            let seq = self.pages.seq(t)?;
            let ps = self.pages.page_size();
            let mut tok = a;
            while tok < b {
                let slot = self.pages.slot(t, seq, tok)? as usize;
                if slot >= slots {
                    return Err(Error::Shape(format!(
                        "row {t}: token {tok} is on page {} but the key cache has {} pages",
                        slot / ps,
                        slots / ps
                    )));
                }
                tok = (tok / ps + 1) * ps;
            }
        }
        Ok(())
    }
    /// The cache decoded: every slot's key (f32 `[slots, d]`) and scale.
    fn decode(&self, d: usize) -> (Vec<f32>, Vec<f32>) {
        let ps = self.pages.page_size();
        let n = self.num_pages(d) * ps;
        let mut k = vec![0f32; n * d];
        let mut sc = vec![0f32; n];
        for slot in 0..n {
            let base = (slot / ps) * self.page_bytes(d);
            let j = slot % ps;
            for (x, &b) in k[slot * d..(slot + 1) * d].iter_mut().zip(&self.cache[base + j * d..base + (j + 1) * d]) {
                *x = F8E4M3(b).to_f32();
            }
            let at = base + ps * d + 4 * j;
            sc[slot] = f32::from_le_bytes(self.cache[at..at + 4].try_into().expect("4 bytes"));
        }
        (k, sc)
    }
}

/// [`dsa_scores`] over a paged fp8 key cache ([`DsaPagedKeys`]; the keys'
/// scales are the cache's): the same arithmetic, key `s` of row `t` read
/// through the row's page table.
pub fn dsa_scores_paged<Q: KeyElem>(
    q: &[Q],
    keys: &DsaPagedKeys<'_>,
    weights: &[f32],
    starts: &[i32],
    ends: &[i32],
    spec: &DsaScoresSpec,
) -> Result<Vec<f32>> {
    check_request(spec, q.len(), spec.keys * spec.dim, None, weights, starts, ends)?;
    keys.check(spec, starts, ends)?;
    let mut out = try_vec("scores", spec.out_len()?, 0f32)?;
    if spec.keys == 0 {
        return Ok(out);
    }
    let (kf, sc) = keys.decode(spec.dim);
    let (h, d, ps) = (spec.heads, spec.dim, keys.pages.page_size());
    let f = row_fn(d);
    let (table, mp) = (keys.pages.table(), keys.pages.max_pages());
    out.par_chunks_mut(spec.keys).enumerate().for_each(|(t, row)| {
        let qt = decode(&q[t * h * d..(t + 1) * h * d]);
        let seq = keys.pages.seq_ids()[t] as usize;
        let slot = |s: usize| table[seq * mp + s / ps] as usize * ps + s % ps;
        f(&qt, &kf, Some(&sc), &weights[t * h..(t + 1) * h], (starts[t] as usize, ends[t] as usize), &slot, row);
    });
    Ok(out)
}

/// The float64 reference of [`dsa_scores`]: the contract's formula with
/// every product and sum in f64 (`-inf` outside the ranges; NaN where an
/// input makes the value NaN).
pub fn reference_dsa_scores<Q: KeyElem, K: KeyElem>(
    q: &[Q],
    k: &[K],
    k_scale: Option<&[f32]>,
    weights: &[f32],
    starts: &[i32],
    ends: &[i32],
    spec: &DsaScoresSpec,
) -> Result<Vec<f64>> {
    check_request(spec, q.len(), k.len(), k_scale, weights, starts, ends)?;
    let (n, h, d) = (spec.keys, spec.heads, spec.dim);
    let mut out = try_vec("scores", spec.out_len()?, f64::NEG_INFINITY)?;
    out.par_chunks_mut(n.max(1)).enumerate().take(spec.rows).for_each(|(t, row)| {
        for s in starts[t] as usize..ends[t] as usize {
            let mut acc = 0f64;
            for hh in 0..h {
                let qh = &q[(t * h + hh) * d..(t * h + hh + 1) * d];
                let dot: f64 =
                    qh.iter().zip(&k[s * d..(s + 1) * d]).map(|(a, b)| a.to_f32() as f64 * b.to_f32() as f64).sum();
                let r = if dot > 0.0 || dot.is_nan() { dot } else { 0.0 };
                acc += weights[t * h + hh] as f64 * r;
            }
            row[s] = acc * k_scale.map_or(1.0, |sc| sc[s] as f64);
        }
    });
    Ok(out)
}

/// The stated bound on `|score - exact|` (module docs) for a score whose
/// `M = |k_scale| * sum over h of |w_h| * A_h` is `m`, with `wmax = max(1,
/// |k_scale|) * max(1, max |w_h|)`.
pub fn error_bound(spec: &DsaScoresSpec, m: f64, wmax: f64) -> f64 {
    let (d, h) = (spec.dim as f64, spec.heads as f64);
    (d + h + 2.0) * 2f64.powi(-24) * m + (d + 2.0) * h * 2f64.powi(-149) * wmax
}

/// The stated bound on `|score - exact|` of the CUDA engine (its
/// tensor-core order, module docs) for a score whose `M` is `m` and `W` is
/// `wmax` (as [`error_bound`]), queries of dtype `q` and keys of dtype `k`:
/// with `n = (d / 16) * terms(q) * terms(k)` chained mma a dot product
/// (terms: 3 for f32, 1 for bf16 and e4m3), `(68 n + H + 3) * 2^-24 * m +
/// (d * terms(q) * terms(k) + 2) * H * 2^-126 * wmax`. Why: one mma adds 16
/// exact products to its accumulator, each of the 17 addends losing less
/// than 2^-22 of the largest (alignment and truncation), as
/// [`crate::ops::indexer::device_error_bound`]; the weight product, the
/// head sums (at most `H` deep) and the scale add one rounding each; a
/// subnormal product may be flushed.
pub fn device_error_bound(spec: &DsaScoresSpec, m: f64, wmax: f64, q: DType, k: DType) -> f64 {
    let terms = |t: DType| if t == DType::F32 { 3.0 } else { 1.0 };
    let (d, h) = (spec.dim as f64, spec.heads as f64);
    let n = d / 16.0 * terms(q) * terms(k);
    (68.0 * n + h + 3.0) * 2f64.powi(-24) * m + (d * terms(q) * terms(k) + 2.0) * h * 2f64.powi(-126) * wmax
}

/// The CPU engine's DSA indexer: the top `select.k` of each row's range of
/// [`dsa_scores`] under `select`'s order and NaN policy (`select.rows`,
/// `cols` and `dtype` must be the scores': `T`, `N`, f32), ids absolute
/// column numbers, or KV slots through `pages` (token `s` of the row's
/// sequence). The same bytes as `select_ranges(_paged)` on the scores.
#[allow(clippy::too_many_arguments)]
pub fn dsa_indexer<Q: KeyElem, K: KeyElem>(
    q: &[Q],
    k: &[K],
    k_scale: Option<&[f32]>,
    weights: &[f32],
    starts: &[i32],
    ends: &[i32],
    spec: &DsaScoresSpec,
    select: &SelectSpec,
    pages: Option<&PageMap<'_>>,
) -> Result<Selection<f32>> {
    check_select(spec, select)?;
    let scores = dsa_scores(q, k, k_scale, weights, starts, ends, spec)?;
    let view = ScoresView::new(&scores, spec.rows, spec.keys)?;
    match pages {
        None => crate::cpu::select_ranges(&view, select, starts, Some(ends)),
        Some(p) => crate::cpu::select_ranges_paged(&view, select, Some(starts), Some(ends), p),
    }
}

/// [`dsa_indexer`] over a paged fp8 key cache: the top `select.k` of each
/// row's range of [`dsa_scores_paged`], ids as token positions, or with
/// `slots` as KV slots through the cache's own page table (DeepSeek-V3.2's
/// index-key cache and its MLA cache share the block table: the slots are
/// the indices FlashMLA's sparse decode reads).
#[allow(clippy::too_many_arguments)]
pub fn dsa_indexer_paged<Q: KeyElem>(
    q: &[Q],
    keys: &DsaPagedKeys<'_>,
    weights: &[f32],
    starts: &[i32],
    ends: &[i32],
    spec: &DsaScoresSpec,
    select: &SelectSpec,
    slots: bool,
) -> Result<Selection<f32>> {
    check_select(spec, select)?;
    let scores = dsa_scores_paged(q, keys, weights, starts, ends, spec)?;
    let view = ScoresView::new(&scores, spec.rows, spec.keys)?;
    if slots {
        crate::cpu::select_ranges_paged(&view, select, Some(starts), Some(ends), &keys.pages)
    } else {
        crate::cpu::select_ranges(&view, select, starts, Some(ends))
    }
}

/// The selection spec must be the scores': `T` rows, `N` columns, f32,
/// rows packed (`row_stride = N`: the scores are written densely).
fn check_select(spec: &DsaScoresSpec, select: &SelectSpec) -> Result<()> {
    if select.rows != spec.rows
        || select.cols != spec.keys
        || select.dtype != DType::F32
        || select.row_stride != spec.keys
    {
        return Err(Error::Shape(format!(
            "the selection spec ({} x {} {}, row stride {}) must be the scores' ({} x {} f32, row stride {})",
            select.rows, select.cols, select.dtype, select.row_stride, spec.rows, spec.keys, spec.keys
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;

pub mod check;
pub mod device;
pub use device::{DeviceDsaIndexer, DeviceDsaScores, DevicePagedKeys};
