//! `flashsel check`'s sparse MLA cases: the CUDA engine's prefill and decode
//! against the float64 reference with FlashMLA's tolerances
//! ([`OUT_TOLERANCE`], [`LSE_TOLERANCE`]) on FlashMLA's case list and more:
//! `s_q` 1, 62, 213 and long prefills (sampled rows checked), `s_kv < topk`,
//! ~2% rows with no valid index, interior invalid entries (a valid one after
//! them is still attended), invalid tails of every kind FlashMLA's tests
//! use, random `topk_length`, sinks with `±inf`, strided kv rows and pages,
//! h_q 1 to 128, d_qk 512 / 576, bf16 and f32, dense and fp8 caches. Every
//! KV row (token) that no attended entry reads is NaN, so a read of one
//! shows in the outputs. Rows without `topk_length` run twice more with the
//! derived length passed explicitly: the same bits.

use half::bf16;

use super::device::{MlaPath, MlaPlan};
use super::{
    check_close, derive_topk_length, quantize_fp8_token, reference_sparse_mla_decode, reference_sparse_mla_prefill,
    CacheFormat, DecodeOutput, MlaElem, PagedKvCache, PrefillOutput, SparseMlaDecode, SparseMlaPrefill,
    FP8_TOKEN_BYTES, LSE_TOLERANCE, OUT_TOLERANCE,
};
use crate::contract::{DType, Result};
use crate::cuda::CudaEngine;
use crate::data::{normal_scores, Rng};
use crate::ops::select::plan::DeviceProps;

/// How a case's lengths are given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lengths {
    /// No `topk_length`: derived (and the derived lengths passed explicitly
    /// must give the same bits).
    Derived,
    /// Random explicit lengths in `0..=topk`, one per row.
    Random,
    /// Decode: one random length per request (FlashMLA's `[b]`).
    PerRequest,
}

/// The cache of a decode case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeCache {
    pub batch: usize,
    pub format: CacheFormat,
    pub page_size: usize,
    /// Extra elements (bytes for fp8) after each token and each page.
    pub token_pad: usize,
    pub page_pad: usize,
}

/// One sparse MLA check case.
#[derive(Debug, Clone)]
pub struct MlaCase {
    /// `None`: prefill; `Some`: decode over this cache.
    pub decode: Option<DecodeCache>,
    /// Query rows (decode: per request).
    pub s_q: usize,
    /// KV rows (decode: tokens of the cache, rounded up to whole pages).
    pub s_kv: usize,
    pub h_q: usize,
    pub d_qk: usize,
    pub topk: usize,
    /// q's dtype (and kv's, for prefill).
    pub dtype: DType,
    pub lengths: Lengths,
    pub sink: bool,
    /// Prefill: extra elements between kv rows.
    pub kv_pad: usize,
    /// Check only this many rows (spread over the batch) against the
    /// reference; `None`: all.
    pub sample: Option<usize>,
    /// Prefill: a NaN in the first attended key of the first row that
    /// attends one (its logits are NaN, so every head of every row that
    /// attends that key is NaN: lse, out and max_logits, as in the
    /// reference).
    pub nan_key: bool,
}

impl MlaCase {
    fn prefill(s_q: usize, s_kv: usize, h_q: usize, d_qk: usize, topk: usize, dtype: DType) -> Self {
        MlaCase {
            decode: None,
            s_q,
            s_kv,
            h_q,
            d_qk,
            topk,
            dtype,
            lengths: Lengths::Derived,
            sink: false,
            kv_pad: 0,
            sample: None,
            nan_key: false,
        }
    }
    fn rows(&self) -> usize {
        self.s_q * self.decode.map_or(1, |d| d.batch)
    }
    /// The kernel family the engine must take: tensor cores for bf16 q with
    /// a bf16 or fp8 cache (prefill: kv has q's dtype), f32 otherwise.
    pub fn path(&self) -> MlaPath {
        let bf16_cache = self.decode.map_or(self.dtype == DType::BF16, |d| d.format != CacheFormat::F32);
        if self.dtype == DType::BF16 && bf16_cache {
            MlaPath::TensorCore
        } else {
            MlaPath::F32
        }
    }
    /// The plan's shape-only part (kernel family, heads a CTA before the
    /// device's widening, split-KV or not).
    pub fn plan(&self) -> MlaPlan {
        MlaPlan::new_for(self.path(), self.rows(), self.h_q, self.topk)
    }
    /// The plan the engine must take on `dev`; each case asserts the
    /// engine's plan is this one. The rule, stated here on its own: over an
    /// fp8 cache, 32 heads a CTA become 64 where that CTA's 222,976 bytes of
    /// shared memory fit, 64-head groups pad no more heads than 32-head ones
    /// and the 64-head CTAs are at least the SMs; the split stays.
    pub fn plan_on(&self, dev: &DeviceProps) -> MlaPlan {
        let p = self.plan();
        let h = self.h_q;
        let fp8 = self.decode.is_some_and(|d| d.format == CacheFormat::Fp8V32);
        let ctas = self.rows() * h.div_ceil(64) * p.splits;
        if p.path == MlaPath::TensorCore
            && fp8
            && h > 32
            && h.div_ceil(64) * 64 == h.div_ceil(32) * 32
            && dev.max_smem_per_block >= 222_976
            && ctas >= dev.sm_count as usize
        {
            MlaPlan { heads_per_cta: 64, groups: h.div_ceil(64), ..p }
        } else {
            p
        }
    }
    pub fn describe(&self) -> String {
        let what = match self.decode {
            None => format!("prefill s_q={} s_kv={} kv_pad={}", self.s_q, self.s_kv, self.kv_pad),
            Some(d) => format!(
                "decode b={} s_q={} tokens={} cache={} page={} pads={}/{}",
                d.batch,
                self.s_q,
                self.s_kv,
                d.format.name(),
                d.page_size,
                d.token_pad,
                d.page_pad
            ),
        };
        format!(
            "mla {what} h_q={} d_qk={} topk={} {} lengths={:?} sink={}{}",
            self.h_q,
            self.d_qk,
            self.topk,
            self.dtype.name(),
            self.lengths,
            self.sink,
            self.sample.map_or(String::new(), |n| format!(" ({n} rows checked)")),
        ) + if self.nan_key { " nan_key" } else { "" }
    }
}

/// The outcome of one case.
#[derive(Debug, Clone)]
pub struct MlaOutcome {
    pub case: String,
    /// Whether the plan split the positions (one-pass kernel + combine).
    pub split: bool,
    /// The kernel family that ran.
    pub path: MlaPath,
    /// Heads a CTA of the plan that ran.
    pub heads_per_cta: usize,
    pub ok: bool,
    pub detail: String,
    /// FNV-1a of the result's bits (out, lse, max_logits): the same seed gives
    /// the same data, so two builds, plans or devices that must agree byte for
    /// byte print the same digest.
    pub digest: u64,
}

/// The invalid values FlashMLA's tests pad with (those `>= bound` or
/// negative for this bound).
pub(crate) fn invalid_values(bound: usize) -> Vec<i32> {
    let mut v = vec![i32::MIN, -123_456, -1, i32::MAX, 2_147_480_000];
    for x in [bound as i64, 114_514, 1_919_810] {
        if x >= bound as i64 && x <= i32::MAX as i64 {
            v.push(x as i32);
        }
    }
    v
}

/// One row's index list: a valid prefix of random length (duplicates
/// allowed), a few invalid entries inside it, an invalid tail; about 2% of
/// rows have no valid entry at all.
pub(crate) fn index_rows(rng: &mut Rng, rows: usize, topk: usize, bound: usize) -> Vec<i32> {
    let bad = invalid_values(bound);
    let mut out = Vec::with_capacity(rows * topk);
    for r in 0..rows {
        let cap = topk.min(bound);
        let valid = if bound == 0 || rng.below(50) == 0 {
            0
        } else if rng.below(2) == 0 {
            cap
        } else {
            1 + rng.below(cap as u64) as usize
        };
        let row_bad = bad[r % bad.len()];
        for p in 0..topk {
            let x = if p < valid {
                // ~3% interior invalid entries (never the prefix's last one,
                // so the derived length stays `valid`).
                if p + 1 < valid && rng.below(32) == 0 {
                    bad[rng.below(bad.len() as u64) as usize]
                } else {
                    rng.below(bound as u64) as i32
                }
            } else if rng.below(4) == 0 {
                bad[rng.below(bad.len() as u64) as usize]
            } else {
                row_bad
            };
            out.push(x);
        }
    }
    out
}

fn lengths_for(c: &MlaCase, rng: &mut Rng) -> Option<Vec<i32>> {
    match c.lengths {
        Lengths::Derived => None,
        Lengths::Random => Some((0..c.rows()).map(|_| rng.below(c.topk as u64 + 1) as i32).collect()),
        Lengths::PerRequest => {
            let b = c.decode.map_or(c.rows(), |d| d.batch);
            Some((0..b).map(|_| rng.below(c.topk as u64 + 1) as i32).collect())
        }
    }
}

/// Sinks: normal values, with `+inf` and `-inf` at heads 1 and 2 (when
/// there are that many).
fn sinks_for(c: &MlaCase, rng: &mut Rng) -> Option<Vec<f32>> {
    c.sink.then(|| {
        (0..c.h_q)
            .map(|h| match h {
                1 => f32::INFINITY,
                2 => f32::NEG_INFINITY,
                _ => rng.normal() * 2.0,
            })
            .collect()
    })
}

/// Which slots (rows) an attended entry reads, by the contract's rule.
fn attended_slots(idx: &[i32], topk: usize, lens: Option<&[i32]>, per_request: usize, bound: usize) -> Vec<bool> {
    let mut used = vec![false; bound];
    for (r, row) in idx.chunks_exact(topk).enumerate() {
        let l = lens.map_or(topk, |l| l[if l.len() == idx.len() / topk { r } else { r / per_request }] as usize);
        for &i in &row[..l] {
            if i >= 0 && (i as usize) < bound {
                used[i as usize] = true;
            }
        }
    }
    used
}

fn cast<T: MlaElem>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

/// The rows a case checks: all, or `n` spread over the batch (first and
/// last included).
fn checked_rows(c: &MlaCase) -> Vec<usize> {
    let rows = c.rows();
    match c.sample {
        Some(n) if n < rows => (0..n).map(|i| i * (rows - 1) / (n - 1).max(1)).collect(),
        _ => (0..rows).collect(),
    }
}

/// Compares one output against the reference under `tol`, over the checked
/// rows (`w` values a row).
fn compare(
    what: &str,
    got: &[f32],
    want: &[f64],
    rows: &[usize],
    w: usize,
    tol: super::Tolerance,
) -> std::result::Result<(), String> {
    let g: Vec<f32> = rows.iter().flat_map(|&r| got[r * w..(r + 1) * w].iter().copied()).collect();
    check_close(what, &g, want, tol)
}

pub(crate) fn digest_of(parts: &[&[f32]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for v in parts {
        for x in v.iter() {
            for b in x.to_bits().to_le_bytes() {
                h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
    }
    h
}

pub(crate) fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A prefill case: the GPU against the reference (on the checked rows), and
/// without `topk_length` the derived lengths passed explicitly, bit for bit.
fn run_prefill<T: MlaElem>(e: &CudaEngine, c: &MlaCase, rng: &mut Rng) -> Result<(bool, String, u64)> {
    let kv_stride = c.d_qk + c.kv_pad;
    let spec = SparseMlaPrefill::new(c.s_q, c.s_kv, c.h_q, c.d_qk, c.topk, 1.0 / (c.d_qk as f32).sqrt())
        .with_dtype(T::DTYPE)
        .with_kv_stride(kv_stride);
    let seed = rng.next_u64();
    let q: Vec<T> = cast(&normal_scores(c.s_q * c.h_q * c.d_qk, seed, 1));
    let mut kvf = normal_scores(spec.kv_len()?, seed, 2);
    let idx = index_rows(rng, c.s_q, c.topk, c.s_kv);
    let lens = lengths_for(c, rng);
    let sink = sinks_for(c, rng);
    // Poison every element no attended entry reads (rows and padding).
    let used = attended_slots(&idx, c.topk, lens.as_deref(), 1, c.s_kv);
    for (i, x) in kvf.iter_mut().enumerate() {
        let (row, col) = (i / kv_stride, i % kv_stride);
        if col >= c.d_qk || !used[row] {
            *x = f32::NAN;
        }
    }
    let mut planted = false;
    if c.nan_key {
        // The first attended key of the first row that attends one.
        for (r, row) in idx.chunks_exact(c.topk).enumerate() {
            let l = lens.as_ref().map_or(c.topk, |l| l[r] as usize);
            if let Some(&i) = row[..l].iter().find(|&&i| i >= 0 && (i as usize) < c.s_kv) {
                kvf[i as usize * kv_stride] = f32::NAN;
                planted = true;
                break;
            }
        }
    }
    let kv: Vec<T> = cast(&kvf);
    drop(kvf);
    let mut fails = Vec::new();
    if c.nan_key && !planted {
        fails.push("no row attends a key to make NaN (the case would test nothing)".to_string());
    }
    let plan = e.sparse_mla_prefill_plan(&spec)?;
    let expected = c.plan_on(&e.props());
    if plan != expected {
        fails.push(format!("the engine's plan {plan:?} is not the expected {expected:?}"));
    }
    let got = e.sparse_mla_prefill_host(&spec, &q, &kv, &idx, lens.as_deref(), sink.as_deref())?;
    // The reference on the checked rows.
    let rows = checked_rows(c);
    let sub_q: Vec<T> =
        rows.iter().flat_map(|&r| q[r * c.h_q * c.d_qk..(r + 1) * c.h_q * c.d_qk].iter().copied()).collect();
    let sub_idx: Vec<i32> = rows.iter().flat_map(|&r| idx[r * c.topk..(r + 1) * c.topk].iter().copied()).collect();
    let sub_len: Option<Vec<i32>> = lens.as_ref().map(|l| rows.iter().map(|&r| l[r]).collect());
    let sub_spec = SparseMlaPrefill { s_q: rows.len(), ..spec };
    let want = reference_sparse_mla_prefill(&sub_spec, &sub_q, &kv, &sub_idx, sub_len.as_deref(), sink.as_deref())?;
    let checks = [
        compare("out", &got.out, &want.out, &rows, c.h_q * 512, OUT_TOLERANCE),
        compare("lse", &got.lse, &want.lse, &rows, c.h_q, LSE_TOLERANCE),
        compare("max_logits", &got.max_logits, &want.max_logits, &rows, c.h_q, LSE_TOLERANCE),
    ];
    fails.extend(checks.into_iter().filter_map(|r| r.err()));
    if lens.is_none() {
        let derived = derive_topk_length(&idx, c.topk, c.s_kv);
        let again = e.sparse_mla_prefill_host(&spec, &q, &kv, &idx, Some(&derived), sink.as_deref())?;
        if !same_prefill(&got, &again) {
            fails.push("the derived topk_length passed explicitly gives other bits".into());
        }
    } else {
        let again = e.sparse_mla_prefill_host(&spec, &q, &kv, &idx, lens.as_deref(), sink.as_deref())?;
        if !same_prefill(&got, &again) {
            fails.push("a second run gives other bits".into());
        }
    }
    let digest = digest_of(&[&got.out, &got.lse, &got.max_logits]);
    Ok((fails.is_empty(), fails.join("; "), digest))
}

fn same_prefill(a: &PrefillOutput<f32>, b: &PrefillOutput<f32>) -> bool {
    bits(&a.out) == bits(&b.out) && bits(&a.lse) == bits(&b.lse) && bits(&a.max_logits) == bits(&b.max_logits)
}

fn same_decode(a: &DecodeOutput<f32>, b: &DecodeOutput<f32>) -> bool {
    bits(&a.out) == bits(&b.out) && bits(&a.lse) == bits(&b.lse)
}

/// The cache of a decode case: f32 values of every token, then the format's
/// elements with unread tokens and all padding poisoned (NaN).
enum CacheData {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
    Fp8(Vec<u8>),
}

impl CacheData {
    fn view(&self) -> PagedKvCache<'_> {
        match self {
            CacheData::F32(v) => PagedKvCache::F32(v),
            CacheData::BF16(v) => PagedKvCache::BF16(v),
            CacheData::Fp8(v) => PagedKvCache::Fp8(v),
        }
    }
}

fn build_cache(spec: &SparseMlaDecode, used: &[bool], seed: u64) -> Result<CacheData> {
    use rayon::prelude::*;
    let len = spec.cache_len()?;
    let d = spec.d_qk;
    // Values for the attended slots only (in slot order); everything else
    // stays poisoned.
    let slots: Vec<usize> = (0..spec.slots()).filter(|&s| used[s]).collect();
    let vals = normal_scores(slots.len() * d, seed, 3);
    Ok(match spec.cache {
        CacheFormat::F32 | CacheFormat::BF16 => {
            let mut c = vec![f32::NAN; len];
            for (i, &s) in slots.iter().enumerate() {
                let at = spec.slot_at(s);
                c[at..at + d].copy_from_slice(&vals[i * d..(i + 1) * d]);
            }
            if spec.cache == CacheFormat::F32 {
                CacheData::F32(c)
            } else {
                CacheData::BF16(cast(&c))
            }
        }
        CacheFormat::Fp8V32 => {
            // NaN e4m3 codes, NaN scales and NaN bf16 rope values everywhere
            // unread: 0xff bytes are all three.
            let mut c = vec![0xffu8; len];
            let tokens: Vec<[u8; FP8_TOKEN_BYTES]> = vals.par_chunks_exact(d).map(quantize_fp8_token).collect();
            for (t, &s) in tokens.iter().zip(&slots) {
                let at = spec.slot_at(s);
                c[at..at + FP8_TOKEN_BYTES].copy_from_slice(t);
            }
            CacheData::Fp8(c)
        }
    })
}

fn run_decode<Q: MlaElem>(e: &CudaEngine, c: &MlaCase, dc: DecodeCache, rng: &mut Rng) -> Result<(bool, String, u64)> {
    let w = dc.format.token_width(c.d_qk);
    let num_pages = c.s_kv.div_ceil(dc.page_size).max(1);
    let token_stride = w + dc.token_pad;
    let page_stride = dc.page_size * token_stride + dc.page_pad;
    let spec = SparseMlaDecode::new(
        dc.batch,
        c.s_q,
        c.h_q,
        c.d_qk,
        c.topk,
        num_pages,
        dc.page_size,
        dc.format,
        1.0 / (c.d_qk as f32).sqrt(),
    )
    .with_strides(page_stride, token_stride)
    .with_q_dtype(Q::DTYPE);
    let slots = spec.slots();
    let seed = rng.next_u64();
    let rows = spec.rows();
    let q: Vec<Q> = cast(&normal_scores(rows * c.h_q * c.d_qk, seed, 1));
    let idx = index_rows(rng, rows, c.topk, slots);
    let lens = lengths_for(c, rng);
    let sink = sinks_for(c, rng);
    let used = attended_slots(&idx, c.topk, lens.as_deref(), c.s_q, slots);
    let cache = build_cache(&spec, &used, seed)?;
    let mut fails = Vec::new();
    let plan = e.sparse_mla_decode_plan(&spec)?;
    let expected = c.plan_on(&e.props());
    if plan != expected {
        fails.push(format!("the engine's plan {plan:?} is not the expected {expected:?}"));
    }
    let got = e.sparse_mla_decode_host(&spec, &q, cache.view(), &idx, lens.as_deref(), sink.as_deref())?;
    // The reference on whole requests (the checked rows' requests).
    let mut reqs: Vec<usize> = checked_rows(c).iter().map(|&r| r / c.s_q).collect();
    reqs.dedup();
    let per = c.s_q;
    let take = |v: &[i32], w: usize| -> Vec<i32> {
        reqs.iter().flat_map(|&b| v[b * per * w..(b + 1) * per * w].iter().copied()).collect()
    };
    let sub_q: Vec<Q> = reqs
        .iter()
        .flat_map(|&b| q[b * per * c.h_q * c.d_qk..(b + 1) * per * c.h_q * c.d_qk].iter().copied())
        .collect();
    let sub_idx = take(&idx, c.topk);
    let sub_len: Option<Vec<i32>> =
        lens.as_ref().map(|l| if l.len() == rows { take(l, 1) } else { reqs.iter().map(|&b| l[b]).collect() });
    let sub_spec = SparseMlaDecode { batch: reqs.len(), ..spec };
    let want =
        reference_sparse_mla_decode(&sub_spec, &sub_q, cache.view(), &sub_idx, sub_len.as_deref(), sink.as_deref())?;
    // out rows are [b, s_q] rows; lse is [b, h_q, s_q]: a request's block.
    let out_rows: Vec<usize> = reqs.iter().flat_map(|&b| b * per..(b + 1) * per).collect();
    let checks = [
        compare("out", &got.out, &want.out, &out_rows, c.h_q * 512, OUT_TOLERANCE),
        compare("lse", &got.lse, &want.lse, &reqs, c.h_q * per, LSE_TOLERANCE),
    ];
    fails.extend(checks.into_iter().filter_map(|r| r.err()));
    if lens.is_none() {
        let derived = derive_topk_length(&idx, c.topk, slots);
        let again = e.sparse_mla_decode_host(&spec, &q, cache.view(), &idx, Some(&derived), sink.as_deref())?;
        if !same_decode(&got, &again) {
            fails.push("the derived topk_length passed explicitly gives other bits".into());
        }
    } else {
        let again = e.sparse_mla_decode_host(&spec, &q, cache.view(), &idx, lens.as_deref(), sink.as_deref())?;
        if !same_decode(&got, &again) {
            fails.push("a second run gives other bits".into());
        }
    }
    let digest = digest_of(&[&got.out, &got.lse]);
    Ok((fails.is_empty(), fails.join("; "), digest))
}

/// Runs one case with fresh data from `rng`.
pub fn run_case(e: &CudaEngine, c: &MlaCase, rng: &mut Rng) -> Result<MlaOutcome> {
    let (ok, detail, digest) = match (c.decode, c.dtype) {
        (None, DType::BF16) => run_prefill::<bf16>(e, c, rng)?,
        (None, _) => run_prefill::<f32>(e, c, rng)?,
        (Some(d), DType::BF16) => run_decode::<bf16>(e, c, d, rng)?,
        (Some(d), _) => run_decode::<f32>(e, c, d, rng)?,
    };
    let heads_per_cta = c.plan_on(&e.props()).heads_per_cta;
    Ok(MlaOutcome { case: c.describe(), split: c.plan().split(), path: c.path(), heads_per_cta, ok, detail, digest })
}

/// The cases (`quick`: a subset, every path and format still covered).
pub fn cases(quick: bool) -> Vec<MlaCase> {
    let mut out = Vec::new();
    let heads = [1, 8, 16, 24, 64, 128];
    // FlashMLA's (s_kv, topk) pairs, s_kv < topk among them.
    let shapes: &[(usize, usize)] =
        &[(128, 128), (256, 256), (512, 512), (592, 128), (1840, 256), (1592, 384), (1521, 512), (95, 128), (40, 300)];
    let s_qs: &[usize] = if quick { &[1, 62] } else { &[1, 62, 213] };
    for (i, &s_q) in s_qs.iter().enumerate() {
        for (j, &(s_kv, topk)) in shapes.iter().enumerate() {
            if quick && j % 2 == 1 {
                continue;
            }
            let mut c = MlaCase::prefill(
                s_q,
                s_kv,
                heads[(i * 4 + j) % heads.len()],
                if (i + j) % 2 == 0 { 576 } else { 512 },
                topk,
                if j % 3 == 2 { DType::F32 } else { DType::BF16 },
            );
            c.lengths = if (i + j) % 3 == 1 { Lengths::Random } else { Lengths::Derived };
            c.sink = (i + j) % 2 == 1;
            c.kv_pad = [0, 3, 64, 1][j % 4];
            out.push(c);
        }
    }
    // Every head count once at topk 2048 (split for the few-CTA ones).
    for (k, &h) in heads.iter().enumerate() {
        let mut c = MlaCase::prefill(if quick { 4 } else { 16 }, 4096, h, 576, 2048, DType::BF16);
        c.sink = k % 2 == 0;
        c.lengths = if k % 3 == 2 { Lengths::Random } else { Lengths::Derived };
        out.push(c);
    }
    // Any topk (masking): not a multiple of the tile.
    for topk in [1, 31, 33, 100] {
        let mut c = MlaCase::prefill(5, 300, 24, 512, topk, DType::F32);
        c.sink = true;
        out.push(c);
    }
    // Long prefills, rows sampled: the bench shape and a long s_q.
    let (big, long) = if quick { (512, 8192) } else { (4096, 70_000) };
    let mut c = MlaCase::prefill(big, 32_768, 128, 576, 2048, DType::BF16);
    c.sample = Some(24);
    out.push(c);
    let mut c = MlaCase::prefill(long, 8192, 16, 512, 128, DType::BF16);
    c.sample = Some(40);
    c.lengths = Lengths::Random;
    out.push(c);

    // Decode: every cache format, page geometry, lengths layout.
    let dec = |batch, s_q, h_q, d_qk, topk, format, page_size, tokens| MlaCase {
        decode: Some(DecodeCache { batch, format, page_size, token_pad: 0, page_pad: 0 }),
        s_q,
        s_kv: tokens,
        h_q,
        d_qk,
        topk,
        dtype: DType::BF16,
        lengths: Lengths::Derived,
        sink: false,
        kv_pad: 0,
        sample: None,
        nan_key: false,
    };
    let formats = [CacheFormat::Fp8V32, CacheFormat::BF16, CacheFormat::F32];
    let geoms: &[(usize, usize, usize, usize, usize)] = &[
        // batch, s_q, h_q, topk, tokens
        (1, 1, 128, 2048, 8192),
        (2, 2, 64, 512, 3000),
        (5, 1, 16, 128, 1000),
        (16, 2, 24, 256, 4096),
        (3, 2, 1, 100, 90),
        (4, 1, 8, 64, 20_000),
    ];
    for (g, &(batch, s_q, h_q, topk, tokens)) in geoms.iter().enumerate() {
        for (f, &format) in formats.iter().enumerate() {
            if quick && (g + f) % 2 == 1 {
                continue;
            }
            let d_qk = if format == CacheFormat::Fp8V32 || (g + f) % 2 == 0 { 576 } else { 512 };
            let page_size = [64, 1, 17][(g + f) % 3];
            let mut c = dec(batch, s_q, h_q, d_qk, topk, format, page_size, tokens);
            c.dtype = if (g + f) % 3 == 2 { DType::F32 } else { DType::BF16 };
            c.lengths = [Lengths::Derived, Lengths::PerRequest, Lengths::Random][(g + 2 * f) % 3];
            c.sink = (g + f) % 2 == 0;
            if let Some(d) = c.decode.as_mut() {
                (d.token_pad, d.page_pad) = [(0, 0), (16, 48), (3, 5)][(g + f) % 3];
            }
            out.push(c);
        }
    }
    // A NaN attended key, on both kernel families.
    for (h_q, dtype) in [(64, DType::BF16), (8, DType::F32)] {
        let mut c = MlaCase::prefill(6, 300, h_q, 576, 128, dtype);
        c.nan_key = true;
        out.push(c);
    }
    // The 64-head CTA (fp8, sm_90): split (64 rows of 128 heads: 2 chunks)
    // and not (160 rows of 64 heads), with random lengths and sinks.
    let mut c = dec(64, 1, 128, 576, 2048, CacheFormat::Fp8V32, 64, 4096);
    c.sample = Some(8);
    out.push(c);
    let mut c = dec(80, 2, 64, 576, 256, CacheFormat::Fp8V32, 16, 2000);
    (c.lengths, c.sink, c.sample) = (Lengths::Random, true, Some(8));
    out.push(c);
    // The decode bench shape (sampled requests).
    let mut c = dec(if quick { 16 } else { 128 }, 2, 128, 576, 2048, CacheFormat::Fp8V32, 64, 32_768);
    c.sample = Some(8);
    out.push(c);
    out
}

/// Totals of a run.
#[derive(Debug, Clone, Default)]
pub struct MlaReport {
    pub run: usize,
    pub failed: usize,
    pub split: usize,
    /// Cases on the tensor-core kernels (the rest ran the f32 kernels).
    pub tensor_core: usize,
    pub failures: Vec<MlaOutcome>,
}

/// Runs every case, or with `filter` those whose description contains it
/// (their data then differ from a whole run's: skipped cases draw none),
/// calling `progress` after each.
pub fn run_suite(
    e: &CudaEngine,
    quick: bool,
    seed: u64,
    filter: Option<&str>,
    mut progress: impl FnMut(usize, usize, &MlaOutcome),
) -> Result<MlaReport> {
    let mut rng = Rng::new(seed ^ 0x006d_6c61);
    let cases: Vec<MlaCase> =
        cases(quick).into_iter().filter(|c| crate::ops::select::check::filter_keeps(filter, &c.describe())).collect();
    let mut rep = MlaReport::default();
    for (i, c) in cases.iter().enumerate() {
        let o = run_case(e, c, &mut rng).unwrap_or_else(|err| MlaOutcome {
            case: c.describe(),
            split: c.plan().split(),
            path: c.path(),
            heads_per_cta: c.plan().heads_per_cta,
            ok: false,
            detail: format!("error: {err}"),
            digest: 0,
        });
        rep.run += 1;
        rep.split += o.split as usize;
        rep.tensor_core += (o.path == MlaPath::TensorCore) as usize;
        if !o.ok {
            rep.failed += 1;
            rep.failures.push(o.clone());
        }
        progress(i + 1, cases.len(), &o);
    }
    Ok(rep)
}

/// A few small cases for compute-sanitizer (`flashsel-dev small`): prefill
/// split and not, strided kv, each cache format, invalid tails.
pub fn small_cases() -> Vec<MlaCase> {
    let mut out = Vec::new();
    let mut c = MlaCase::prefill(3, 200, 24, 576, 100, DType::BF16);
    c.kv_pad = 3;
    c.sink = true;
    out.push(c);
    let mut c = MlaCase::prefill(40, 300, 16, 512, 64, DType::F32);
    c.lengths = Lengths::Random;
    out.push(c);
    for (i, format) in [CacheFormat::Fp8V32, CacheFormat::BF16, CacheFormat::F32].into_iter().enumerate() {
        out.push(MlaCase {
            decode: Some(DecodeCache { batch: 2, format, page_size: 17, token_pad: 3 * i, page_pad: 5 }),
            s_q: 2,
            s_kv: 300,
            h_q: 8,
            d_qk: 576,
            topk: 96,
            dtype: if i == 2 { DType::F32 } else { DType::BF16 },
            lengths: [Lengths::Derived, Lengths::PerRequest, Lengths::Random][i],
            sink: i == 0,
            kv_pad: 0,
            sample: None,
            nan_key: false,
        });
    }
    // The 64-head CTA on sm_90 (fp8, 140 rows of 64 heads: 140 CTAs, one a
    // request; aligned and unaligned tokens), whose two KV buffers racecheck
    // should see.
    for token_pad in [0, 3] {
        out.push(MlaCase {
            decode: Some(DecodeCache {
                batch: 140,
                format: CacheFormat::Fp8V32,
                page_size: 16,
                token_pad,
                page_pad: 0,
            }),
            s_q: 1,
            s_kv: 160,
            h_q: 64,
            d_qk: 576,
            topk: 96,
            dtype: DType::BF16,
            lengths: Lengths::Random,
            sink: false,
            kv_pad: 0,
            sample: Some(4),
            nan_key: false,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_cover_the_paths_and_formats() {
        for quick in [false, true] {
            let cs = cases(quick);
            assert!(cs.iter().any(|c| c.plan().split()) && cs.iter().any(|c| !c.plan().split()));
            // Both kernel families, split and not, and both tensor-core
            // head blocks.
            for path in [MlaPath::TensorCore, MlaPath::F32] {
                for split in [false, true] {
                    assert!(cs.iter().any(|c| c.path() == path && c.plan().split() == split), "{path:?} {split}");
                }
            }
            for heads in [16, 32] {
                assert!(cs.iter().any(|c| c.plan().heads_per_cta == heads && c.decode.is_none()), "{heads}");
                assert!(cs.iter().any(|c| c.plan().heads_per_cta == heads && c.decode.is_some()), "{heads}");
            }
            // On sm_90 (an H100's 132 SMs) the 64-head CTA, split and not; on
            // sm_89 none.
            let (h100, ada) = (DeviceProps::hopper(132), DeviceProps::ada(128));
            let wide = |c: &MlaCase| c.plan_on(&h100).heads_per_cta == 64;
            for split in [false, true] {
                assert!(cs.iter().any(|c| wide(c) && c.plan().split() == split), "{split}");
            }
            assert!(cs.iter().any(|c| !wide(c) && c.decode.is_some_and(|d| d.format == CacheFormat::Fp8V32)));
            assert!(cs.iter().all(|c| c.plan_on(&ada) == c.plan()));
            assert!(small_cases().iter().any(wide), "the sanitizers see the 64-head CTA");
            for h in [1, 8, 16, 24, 64, 128] {
                assert!(cs.iter().any(|c| c.h_q == h), "h_q {h}");
            }
            for f in [CacheFormat::Fp8V32, CacheFormat::BF16, CacheFormat::F32] {
                assert!(cs.iter().any(|c| c.decode.is_some_and(|d| d.format == f)), "{f:?}");
            }
            assert!(cs.iter().any(|c| c.s_kv < c.topk));
            for c in &cs {
                let spec_ok = match c.decode {
                    None => SparseMlaPrefill::new(c.s_q, c.s_kv, c.h_q, c.d_qk, c.topk, 0.1).validate(),
                    Some(d) => {
                        SparseMlaDecode::new(d.batch, c.s_q, c.h_q, c.d_qk, c.topk, 1, d.page_size, d.format, 0.1)
                            .validate()
                    }
                };
                assert!(spec_ok.is_ok(), "{}", c.describe());
            }
        }
    }

    #[test]
    fn index_rows_follow_the_recipe() {
        let mut rng = Rng::new(3);
        let idx = index_rows(&mut rng, 400, 64, 100);
        let lens = derive_topk_length(&idx, 64, 100);
        assert!(lens.contains(&0), "some rows have no valid index");
        assert!(lens.contains(&64));
        // Interior invalid entries exist (an invalid entry before a valid one).
        let interior =
            idx.chunks(64).zip(&lens).any(|(row, &l)| row[..l as usize].iter().any(|&x| !(0..100).contains(&x)));
        assert!(interior);
        let bad = invalid_values(100);
        assert!(bad.contains(&100) && bad.contains(&114_514) && bad.contains(&i32::MIN) && !bad.contains(&99));
    }

    #[test]
    fn sampled_rows_include_both_ends() {
        let mut c = MlaCase::prefill(100, 10, 1, 512, 1, DType::F32);
        c.sample = Some(5);
        assert_eq!(checked_rows(&c), vec![0, 24, 49, 74, 99]);
    }
}
