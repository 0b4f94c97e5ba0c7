//! `qsa_scores`: the QSA indexer, from queries and block keys to the block
//! scores [`qsa_select`](crate::ops::qsa) ranks.
//!
//! # Contract
//! Row `t` is the query at absolute position `positions[t]` (`>= 0`) with
//! `H` heads of `d` values (`q [T, H, d]`, row-major; `1 <= H <= 16`, `d` in
//! {64, 128, 256}; f32 or bf16). It sees `V(t) = (positions[t] + 1) / ratio`
//! complete blocks (`V <= NB`, else an error). Its scores, f32 `[T, NB]`:
//!
//! ```text
//! score[t, b] = sum over h of relu(q[t, h, :] . kbar[b, :]) / sqrt(d)   for b < V(t)
//! score[t, b] = -inf                                                  for V(t) <= b < NB
//! ```
//!
//! `kbar` (f32, bf16 or fp8 e4m3 without a scale, [`F8E4M3`]) is either one
//! sequence `[NB, d]` ([`BlockKeys::Contiguous`]) or a paged cache `[pages,
//! blocks_per_page, d]` ([`BlockKeys::Paged`]): block `b` of sequence `s`
//! is `kbar[page_table[s, b / blocks_per_page], b % blocks_per_page]`, with
//! `blocks_per_page = page_size / ratio` (the token page table of
//! [`PageMap`], so the same table serves `qsa_select`'s slots).
//!
//! ```
//! use flashsel::ops::indexer::{BlockKeys, QsaScoresSpec};
//!
//! // One query (1 head of 64) at position 7 (V = 2 blocks of 4) over 3 blocks.
//! let spec = QsaScoresSpec::new(1, 3).with_heads(1).with_dim(64);
//! let mut q = vec![0f32; 64];
//! q[0] = 2.0;
//! let mut kbar = vec![0f32; 3 * 64];
//! kbar[0] = 4.0; // block 0: relu(8) / 8
//! kbar[64] = -1.0; // block 1: relu(-2) / 8
//! let s = flashsel::cpu::qsa_scores(&q, &BlockKeys::Contiguous(&kbar), &[7], &spec)?;
//! assert_eq!(s, [1.0, 0.0, f32::NEG_INFINITY]); // block 2 is past V
//! # Ok::<(), flashsel::Error>(())
//! ```
//!
//! # Arithmetic (the CPU engine, bit for bit)
//! Every input is decoded exactly to f32 (q is never rounded to bf16); then,
//! in f32 with round-to-nearest-even and no fused multiply-add:
//! 1. `dot_h = q[t, h, :] . kbar[b, :]` over [`LANES`] = 8 lanes: lane `l`
//!    starts at `+0.0` and adds the products `q[j] * k[j]` (each rounded to
//!    f32) of `j = l, l + 8, l + 16, ...` in increasing `j`; the lanes then
//!    combine as `((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))`.
//! 2. `r_h = relu(dot_h)`: `dot_h` if `dot_h > 0`, NaN if it is NaN, else
//!    `+0.0`.
//! 3. `s = r_0 + r_1 + ... + r_{H-1}`, left to right from `+0.0`.
//! 4. `score = s * c` with `c` the f32 nearest `1/sqrt(d)` ([`QsaScoresSpec::scale`]:
//!    exactly 0.125 and 0.0625 for d = 64 and 256). A NaN score is the quiet
//!    NaN `0x7fc00000`.
//!
//! # Error bound
//! Against the exact value (and the float64 [`reference_qsa_scores`]), for
//! finite inputs with `sum over h of A_h <= 2^127` (no overflow), where
//! `A_h = sum over j of |q[t, h, j] * kbar[b, j]|` and `M = sum over h of A_h / sqrt(d)`:
//!
//! ```text
//! |score[t, b] - exact[t, b]| <= (d + H + 2) * 2^-24 * M + (d * H + 1) * 2^-149
//! ```
//!
//! ([`error_bound`]; the second term covers underflow). It holds for every
//! summation order of the `d` products and the `H` heads, with or without
//! fused multiply-adds, as long as each operation is an f32 operation rounded
//! to nearest: the dot products lose at most `gamma_d * A_h` (relu is
//! 1-Lipschitz, so it adds nothing), the head sum `gamma_{H-1}`, the rounded
//! `c` and the final product one unit each, `gamma_{d+H+1} <= (d + H + 2) *
//! 2^-24` in all (`gamma_n = n u / (1 - n u)`, `u = 2^-24`). A GPU engine
//! with its own (fixed, written down) f32 order meets the same bound; the
//! CUDA engine, whose tensor cores do not round each add to nearest f32,
//! states its own ([`device_error_bound`]).
//!
//! # Work
//! Row `t` reads its `V(t)` blocks only; the rest of the row is filled with
//! `-inf`. Rows are independent: a row's bytes do not depend on the batch
//! or on the thread count.

use half::bf16;
use rayon::prelude::*;

use crate::contract::{try_vec, DType, Error, Result};
pub use crate::ops::pages::PageMap;

/// The most query heads a request may have.
pub const MAX_HEADS: usize = 16;
/// The head widths (`d`) a request may have.
pub const DIMS: [usize; 3] = [64, 128, 256];
/// Lanes of the CPU engine's dot product (see the module docs).
pub const LANES: usize = 8;
/// Blocks per parallel task of the CPU engine.
const CHUNK: usize = 512;

/// One fp8 e4m3 value (OCP `float8_e4m3fn`: 1 sign bit, 4 exponent bits with
/// bias 7, 3 mantissa bits; no infinities; `0x7f` and `0xff` are NaN), as
/// its raw byte. [`Self::to_f32`] decodes it exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct F8E4M3(pub u8);

impl F8E4M3 {
    pub const fn from_bits(bits: u8) -> Self {
        Self(bits)
    }
    pub const fn to_bits(self) -> u8 {
        self.0
    }
    /// The exact f32 value (NaN for `0x7f` / `0xff`, sign kept; `0x80` is
    /// `-0.0`; the largest value is 448, the smallest positive `2^-9`).
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        f32::from_bits(E4M3_F32_BITS[self.0 as usize])
    }
}

/// The f32 bit pattern of the e4m3 value `b`.
const fn e4m3_f32_bits(b: u8) -> u32 {
    let sign = ((b >> 7) as u32) << 31;
    let e = ((b >> 3) & 0xf) as u32;
    let m = (b & 0x7) as u32;
    if e == 0xf && m == 0x7 {
        return sign | 0x7fc0_0000; // NaN
    }
    if e == 0 {
        if m == 0 {
            return sign; // +-0.0
        }
        // Subnormal: m * 2^-9 = 2^(p - 9) * (m / 2^p), p the top bit of m.
        let p = 31 - m.leading_zeros();
        return sign | ((118 + p) << 23) | ((m - (1 << p)) << (23 - p));
    }
    // Normal: 2^(e - 7) * (1 + m / 8).
    sign | ((e + 120) << 23) | (m << 20)
}

/// Every e4m3 code's f32 bits, built at compile time.
static E4M3_F32_BITS: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = e4m3_f32_bits(i as u8);
        i += 1;
    }
    t
};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for super::F8E4M3 {}
}

/// A block-key element type: `f32`, `bf16` or [`F8E4M3`] (sealed).
pub trait KeyElem: sealed::Sealed + Copy + Send + Sync + std::fmt::Debug + 'static {
    const DTYPE: DType;
    /// The exact f32 value.
    fn to_f32(self) -> f32;
}

/// A query element type: `f32` or `bf16`.
pub trait QueryElem: KeyElem {}

impl KeyElem for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}
impl KeyElem for bf16 {
    const DTYPE: DType = DType::BF16;
    /// The top half of an f32, exactly (a NaN stays a NaN, payload kept).
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}
impl KeyElem for F8E4M3 {
    const DTYPE: DType = DType::F8E4M3;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        F8E4M3::to_f32(self)
    }
}
impl QueryElem for f32 {}
impl QueryElem for bf16 {}

/// A `qsa_scores` request: everything but the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QsaScoresSpec {
    /// Queries (`T`, rows of `q` and of the scores).
    pub rows: usize,
    /// Query heads per row (`H`, 1 to 16).
    pub heads: usize,
    /// Values per head and per block key (`d`: 64, 128 or 256).
    pub dim: usize,
    /// Blocks per score row (`NB`).
    pub blocks: usize,
    /// Tokens per block (4 for QSA).
    pub ratio: usize,
}

impl QsaScoresSpec {
    /// QSA's defaults: 4 heads of 128, ratio 4.
    pub fn new(rows: usize, blocks: usize) -> Self {
        Self { rows, heads: 4, dim: 128, blocks, ratio: 4 }
    }
    pub fn with_heads(mut self, heads: usize) -> Self {
        self.heads = heads;
        self
    }
    pub fn with_dim(mut self, dim: usize) -> Self {
        self.dim = dim;
        self
    }
    pub fn with_ratio(mut self, ratio: usize) -> Self {
        self.ratio = ratio;
        self
    }

    /// `c`, the f32 nearest `1 / sqrt(dim)` (the one scale multiplication).
    pub fn scale(&self) -> f32 {
        (1.0 / (self.dim as f64).sqrt()) as f32
    }

    /// Elements of `q`: `rows * heads * dim`.
    pub fn q_len(&self) -> Result<usize> {
        self.rows
            .checked_mul(self.heads)
            .and_then(|x| x.checked_mul(self.dim))
            .ok_or_else(|| Error::Shape(format!("q [{}, {}, {}] overflows", self.rows, self.heads, self.dim)))
    }

    /// Elements of the scores: `rows * blocks`.
    pub fn out_len(&self) -> Result<usize> {
        self.rows
            .checked_mul(self.blocks)
            .ok_or_else(|| Error::Shape(format!("scores [{}, {}] overflow", self.rows, self.blocks)))
    }

    /// The shape rules: `1 <= heads <= 16`, `dim` in {64, 128, 256}, `ratio >= 1`,
    /// sizes that fit `usize`.
    pub fn validate(&self) -> Result<()> {
        if self.heads == 0 || self.heads > MAX_HEADS {
            return Err(Error::InvalidOption {
                what: "heads (H, q's second dimension)",
                value: self.heads.to_string(),
                expected: "1..=16",
            });
        }
        if !DIMS.contains(&self.dim) {
            return Err(Error::InvalidOption {
                what: "head dim (d, the last dimension of q and kbar)",
                value: self.dim.to_string(),
                expected: "64, 128 or 256",
            });
        }
        if self.ratio == 0 {
            return Err(Error::InvalidOption { what: "ratio", value: "0".into(), expected: ">= 1" });
        }
        self.q_len()?;
        self.out_len()?;
        Ok(())
    }

    /// The visible complete blocks of each row, checked: `t >= 0` and
    /// `(t + 1) / ratio <= blocks`.
    fn visible(&self, positions: &[i64]) -> Result<Vec<usize>> {
        let holder = "the keys hold";
        let v =
            crate::ops::qsa::visible_blocks(positions, self.rows, self.ratio, self.blocks, "q has", "rows", holder)?;
        Ok(v)
    }
}

/// The block keys a request reads.
#[derive(Debug, Clone, Copy)]
pub enum BlockKeys<'a, K> {
    /// One sequence: `[NB, d]` row-major, exactly `spec.blocks * spec.dim`
    /// elements; every row reads it.
    Contiguous(&'a [K]),
    /// A paged cache `[pages, blocks_per_page, d]` row-major
    /// (`blocks_per_page = page_size / ratio`, `page_size` a multiple of
    /// `ratio`): block `b` of row `t` is `kbar[page_table[seq_ids[t], b /
    /// blocks_per_page], b % blocks_per_page]`. Every page a row reads (those
    /// of its blocks `0..V(t)`) must be in the table and in `0..pages`; pages
    /// past a row's `V` may be anything.
    Paged { kbar: &'a [K], pages: PageMap<'a> },
}

/// One row's scoring at a head width (see [`score_blocks`]).
type ScoreFn<K> = fn(&[f32], &Resolved<'_, K>, usize, usize, f32, &mut [f32]);

/// Where each row's blocks live, checked.
enum Resolved<'a, K> {
    Flat(&'a [K]),
    Paged { kbar: &'a [K], table: &'a [i32], max_pages: usize, per_page: usize, seq_ids: &'a [i32] },
}

impl<'a, K> Resolved<'a, K> {
    /// Block `b` of row `row` (`b < V(row)`, checked by [`check_request`]).
    #[inline(always)]
    fn block(&self, row: usize, b: usize, dim: usize) -> &'a [K] {
        let at = match *self {
            Resolved::Flat(_) => b,
            Resolved::Paged { table, max_pages, per_page, seq_ids, .. } => {
                let page = table[seq_ids[row] as usize * max_pages + b / per_page] as usize;
                page * per_page + b % per_page
            }
        };
        let data = match *self {
            Resolved::Flat(d) | Resolved::Paged { kbar: d, .. } => d,
        };
        &data[at * dim..(at + 1) * dim]
    }
}

/// Every check the host makes: the spec, `q`'s length, each position, the
/// keys' shape and, when paged, each row's sequence and every page its
/// visible blocks read. Returns each row's `V` and the key addressing.
fn check_request<'a, K>(
    q_len: usize,
    keys: &BlockKeys<'a, K>,
    positions: &[i64],
    spec: &QsaScoresSpec,
) -> Result<(Vec<usize>, Resolved<'a, K>)> {
    spec.validate()?;
    let need = spec.q_len()?;
    if q_len != need {
        return Err(Error::Shape(format!(
            "q holds {q_len} elements but [T = {}, H = {}, d = {}] needs {need}",
            spec.rows, spec.heads, spec.dim
        )));
    }
    let visible = spec.visible(positions)?;
    let resolved = match *keys {
        BlockKeys::Contiguous(kbar) => {
            let need = spec
                .blocks
                .checked_mul(spec.dim)
                .ok_or_else(|| Error::Shape(format!("kbar [{}, {}] overflows", spec.blocks, spec.dim)))?;
            if kbar.len() != need {
                return Err(Error::Shape(format!(
                    "kbar holds {} elements but [NB = {}, d = {}] needs {need}",
                    kbar.len(),
                    spec.blocks,
                    spec.dim
                )));
            }
            Resolved::Flat(kbar)
        }
        BlockKeys::Paged { kbar, pages: map } => {
            let page_size = map.page_size();
            if page_size % spec.ratio != 0 {
                return Err(Error::InvalidOption {
                    what: "page_size",
                    value: format!("{page_size} with ratio {}", spec.ratio),
                    expected: "a multiple of ratio (a page holds whole blocks)",
                });
            }
            let per_page = page_size / spec.ratio;
            let page_elems = per_page * spec.dim;
            if kbar.len() % page_elems != 0 {
                return Err(Error::Shape(format!(
                    "kbar holds {} elements, not a whole number of pages of [blocks_per_page = {per_page}, d = {}]",
                    kbar.len(),
                    spec.dim
                )));
            }
            let cache_pages = kbar.len() / page_elems;
            map.check_rows(spec.rows)?;
            let (table, max_pages, seq_ids) = (map.table(), map.max_pages(), map.seq_ids());
            for (row, &v) in visible.iter().enumerate() {
                let seq = seq_ids[row];
                if seq < 0 || seq as usize >= map.sequences() {
                    return Err(Error::Shape(format!(
                        "seq_ids[{row}] = {seq} is outside 0..{} (the page table's sequences)",
                        map.sequences()
                    )));
                }
                let used = v.div_ceil(per_page);
                if used > max_pages {
                    return Err(Error::Shape(format!(
                        "row {row}: positions[{row}] = {} sees {v} blocks, on {used} pages of {per_page} blocks, \
                         but page_table has {max_pages} pages a sequence",
                        positions[row]
                    )));
                }
                let entries = &table[seq as usize * max_pages..][..used];
                if let Some((j, &p)) = entries.iter().enumerate().find(|&(_, &p)| p < 0 || p as usize >= cache_pages) {
                    return Err(Error::Shape(format!(
                        "page_table[{seq}, {j}] = {p} (row {row}, blocks {}..{}) is outside the key cache's pages \
                         0..{cache_pages}",
                        j * per_page,
                        ((j + 1) * per_page).min(v)
                    )));
                }
            }
            Resolved::Paged { kbar, table, max_pages, per_page, seq_ids }
        }
    };
    Ok((visible, resolved))
}

/// `relu` of the contract: `x` if `x > 0`, NaN if NaN, else `+0.0`.
#[inline(always)]
pub(crate) fn relu(x: f32) -> f32 {
    if x > 0.0 || x.is_nan() {
        x
    } else {
        0.0
    }
}

/// The lane tree of the contract's dot product.
#[inline(always)]
fn combine(a: [f32; LANES]) -> f32 {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

/// The dot products of the contract of `G` heads with one key: per head,
/// [`LANES`] lanes, each in increasing `j`, then [`combine`]. The heads run
/// interleaved (independent chains); each head's order is its own.
#[inline(always)]
pub(crate) fn dots<const D: usize, const G: usize>(q: [&[f32; D]; G], k: &[f32; D]) -> [f32; G] {
    let mut a = [[0f32; LANES]; G];
    for (c, kc) in k.chunks_exact(LANES).enumerate() {
        let kc: &[f32; LANES] = kc.try_into().expect("LANES values");
        for h in 0..G {
            let qc: &[f32; LANES] = q[h][c * LANES..(c + 1) * LANES].try_into().expect("LANES values");
            let acc = &mut a[h];
            for l in 0..LANES {
                acc[l] += qc[l] * kc[l];
            }
        }
    }
    a.map(combine)
}

/// Head `h` of a row's decoded queries.
#[inline(always)]
fn head<const D: usize>(q: &[f32], h: usize) -> &[f32; D] {
    q[h * D..(h + 1) * D].try_into().expect("a head of D values")
}

/// One row's scored blocks `0..out.len()` (starting at block `first`), for
/// head width `D`: heads in groups of 4 (then 2, then 1), summed in order.
#[inline(always)]
fn score_blocks<const D: usize, K: KeyElem>(
    q: &[f32],
    keys: &Resolved<'_, K>,
    row: usize,
    first: usize,
    scale: f32,
    out: &mut [f32],
) {
    let heads = q.len() / D;
    let mut k = [0f32; D];
    for (j, o) in out.iter_mut().enumerate() {
        for (dst, src) in k.iter_mut().zip(keys.block(row, first + j, D)) {
            *dst = src.to_f32();
        }
        let mut s = 0f32;
        let mut h = 0;
        while h + 4 <= heads {
            let r = dots::<D, 4>([head(q, h), head(q, h + 1), head(q, h + 2), head(q, h + 3)], &k);
            s = (((s + relu(r[0])) + relu(r[1])) + relu(r[2])) + relu(r[3]);
            h += 4;
        }
        if h + 2 <= heads {
            let r = dots::<D, 2>([head(q, h), head(q, h + 1)], &k);
            s = (s + relu(r[0])) + relu(r[1]);
            h += 2;
        }
        if h < heads {
            s += relu(dots::<D, 1>([head(q, h)], &k)[0]);
        }
        let score = s * scale;
        *o = if score.is_nan() { f32::NAN } else { score };
    }
}

/// QSA indexer scores on the CPU, written into `out` (`rows * blocks` f32,
/// row-major): the contract's arithmetic bit for bit, parallel over rows and
/// over chunks of each row's visible blocks.
pub fn qsa_scores_into<Q: QueryElem, K: KeyElem>(
    q: &[Q],
    keys: &BlockKeys<'_, K>,
    positions: &[i64],
    spec: &QsaScoresSpec,
    out: &mut [f32],
) -> Result<()> {
    let (visible, resolved) = check_request(q.len(), keys, positions, spec)?;
    let need = spec.out_len()?;
    if out.len() != need {
        return Err(Error::BufferSize { what: "the scores output", got: out.len(), need });
    }
    if need == 0 {
        return Ok(());
    }
    let per_row = spec.heads * spec.dim;
    let (run, scale) = (score_fn::<K>(spec.dim), spec.scale());
    out.par_chunks_mut(spec.blocks).enumerate().for_each(|(row, scores)| {
        score_row(&q[row * per_row..(row + 1) * per_row], &resolved, row, visible[row], run, scale, scores);
    });
    Ok(())
}

/// The engine's row function for head width `dim` (64, 128 or 256, checked).
fn score_fn<K: KeyElem>(dim: usize) -> ScoreFn<K> {
    match dim {
        64 => score_blocks::<64, K>,
        128 => score_blocks::<128, K>,
        _ => score_blocks::<256, K>,
    }
}

/// One row of the engine (`q_row` its `H * d` queries, `v` its checked `V`):
/// `out[..v]` scored, parallel over chunks of [`CHUNK`] blocks, the rest of
/// `out` (`v <= out.len()`) `-inf`. The one row path of [`qsa_scores_into`]
/// and of the fused [`qsa_indexer`].
fn score_row<Q: QueryElem, K: KeyElem>(
    q_row: &[Q],
    resolved: &Resolved<'_, K>,
    row: usize,
    v: usize,
    run: ScoreFn<K>,
    scale: f32,
    out: &mut [f32],
) {
    let qf: Vec<f32> = q_row.iter().map(|x| x.to_f32()).collect();
    let (scored, rest) = out.split_at_mut(v);
    rest.fill(f32::NEG_INFINITY);
    scored.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
        run(&qf, resolved, row, c * CHUNK, scale, chunk);
    });
}

/// QSA indexer scores on the CPU: f32 `[rows, blocks]`, row-major
/// ([`qsa_scores_into`] into a new buffer).
pub fn qsa_scores<Q: QueryElem, K: KeyElem>(
    q: &[Q],
    keys: &BlockKeys<'_, K>,
    positions: &[i64],
    spec: &QsaScoresSpec,
) -> Result<Vec<f32>> {
    spec.validate()?;
    let mut out = try_vec("the scores output", spec.out_len()?, 0f32)?;
    qsa_scores_into(q, keys, positions, spec, &mut out)?;
    Ok(out)
}

/// The float64 reference of the same formula: inputs decoded exactly,
/// sequential f64 dot products, `relu` (NaN kept), heads summed, divided by
/// `sqrt(d)` in f64; `-inf` past each row's `V`. Same checks as
/// [`qsa_scores`]. Its own error (about `(d + H + 2) * 2^-53 * M`) is far
/// below the f32 bound.
pub fn reference_qsa_scores<Q: QueryElem, K: KeyElem>(
    q: &[Q],
    keys: &BlockKeys<'_, K>,
    positions: &[i64],
    spec: &QsaScoresSpec,
) -> Result<Vec<f64>> {
    let (visible, resolved) = check_request(q.len(), keys, positions, spec)?;
    let mut out = try_vec("the reference scores", spec.out_len()?, f64::NEG_INFINITY)?;
    let (h, d) = (spec.heads, spec.dim);
    let sqrt_d = (d as f64).sqrt();
    for (row, &v) in visible.iter().enumerate() {
        let qrow = &q[row * h * d..(row + 1) * h * d];
        for b in 0..v {
            let k = resolved.block(row, b, d);
            let mut s = 0f64;
            for qh in qrow.chunks_exact(d) {
                let dot: f64 = qh.iter().zip(k).map(|(x, y)| x.to_f32() as f64 * y.to_f32() as f64).sum();
                s += if dot > 0.0 || dot.is_nan() { dot } else { 0.0 };
            }
            out[row * spec.blocks + b] = s / sqrt_d;
        }
    }
    Ok(out)
}

/// The stated bound on `|score - exact|` for a score whose
/// `M = sum over h, j of |q[h, j] * kbar[j]| / sqrt(d)` is `m`:
/// `(d + H + 2) * 2^-24 * m + (d * H + 1) * 2^-149`.
pub fn error_bound(spec: &QsaScoresSpec, m: f64) -> f64 {
    let (d, h) = (spec.dim as f64, spec.heads as f64);
    (d + h + 2.0) * 2f64.powi(-24) * m + (d * h + 1.0) * 2f64.powi(-149)
}

/// The stated bound on `|score - exact|` of the CUDA engine (its tensor-core
/// order, docs/semantics.md "The CUDA engine") for a score of magnitude `m`
/// (as [`error_bound`]), queries of dtype `q` and keys of dtype `k`: with
/// `n = (d / 16) * terms(q) * terms(k)` chained mma a dot product (terms:
/// 3 for f32, 1 for bf16 and e4m3), `(68 n + H + 2) * 2^-24 * m +
/// (d * H * terms(q) * terms(k) + 1) * 2^-126`. Why: one mma adds 16 exact
/// products to its accumulator, each of the 17 addends losing less than
/// 2^-22 of the largest (alignment and truncation); relu, the head tree
/// and the scale add one rounding each; a subnormal product may be flushed.
pub fn device_error_bound(spec: &QsaScoresSpec, m: f64, q: DType, k: DType) -> f64 {
    let terms = |t: DType| if t == DType::F32 { 3.0 } else { 1.0 };
    let (d, h) = (spec.dim as f64, spec.heads as f64);
    let n = d / 16.0 * terms(q) * terms(k);
    (68.0 * n + h + 2.0) * 2f64.powi(-24) * m + (d * h * terms(q) * terms(k) + 1.0) * 2f64.powi(-126)
}

pub mod check;
pub mod device;
mod fused;
pub use device::{DeviceBlockKeys, DeviceQsaIndexer, DeviceQsaScores};
pub use fused::{qsa_indexer, QsaIndexerSpec, INDEXER_SCRATCH_BYTES};

#[cfg(test)]
mod tests;
