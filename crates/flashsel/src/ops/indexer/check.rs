//! `flashsel check`'s indexer cases: the CUDA engine's `qsa_scores` within
//! its stated bound of the float64 reference (`device_error_bound`), and
//! the same bits for a row alone as in its batch, on every query and key
//! dtype, head count and width, contiguous and paged keys, with adversarial
//! values (NaN, infinities, subnormals, signed zeros, few distinct values
//! for near-ties); the CUDA `qsa_indexer` against the unfused chain over
//! the device's scores (`qsa_select` on the device and on the CPU), in
//! small groups and whole; and device values out of range.

use cudarc::driver::{CudaSlice, DevicePtr};
use half::bf16;

use super::device::{decode_plan, staged_geometry_on, IndexerPath, ScoreForm};
use super::{BlockKeys, DeviceBlockKeys, DeviceQsaScores, KeyElem, QsaIndexerSpec, QsaScoresSpec, QueryElem, F8E4M3};
use crate::contract::error::cuda_err;
use crate::contract::{DType, Result, ScoresView};
use crate::cuda::{CudaEngine, DevicePages};
use crate::data::Rng;
use crate::ops::pages::PageMap;
use crate::ops::select::check::{pages_for, Outcome};
use crate::ops::select::plan::Path;
use crate::ops::select::OutputOrder;

/// How a case's values are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Values {
    /// Normal queries and keys.
    Normal,
    /// Keys from 3 distinct vectors and small-integer queries: many exactly
    /// equal scores, and exact zeros after relu.
    Ties,
    /// Normal, with NaN, +-inf, subnormals and signed zeros sprinkled in.
    Special,
    /// Keys through the 256 e4m3 values in turn (NaN, subnormals and
    /// zeros included; every key dtype holds them exactly), one-hot
    /// queries: each score is its heads' few keys values, so a wrong
    /// decode of any one code is far outside the bound.
    Codes,
}

/// One indexer check case.
#[derive(Debug, Clone)]
pub struct IndexerCase {
    pub rows: usize,
    pub blocks: usize,
    pub heads: usize,
    pub dim: usize,
    pub q: DType,
    pub k: DType,
    pub values: Values,
    /// Token page size of a paged key cache (`None`: contiguous keys).
    pub page_size: Option<usize>,
    /// Whether the case also runs the fused indexer (`Some(k_blocks)`).
    pub k_blocks: Option<usize>,
    pub order: OutputOrder,
    /// Rows per group of the device indexer (`None`: the engine's own).
    pub group: Option<usize>,
    /// Positions: `None` for edges and random, `Some(t0)` for consecutive
    /// positions from `t0` (a prefill chunk).
    pub chunk: Option<usize>,
}

impl IndexerCase {
    pub fn describe(&self) -> String {
        format!(
            "indexer {}x{} blocks H={} d={} q={} k={} {:?} pages={:?} k_blocks={:?} order={} group={:?} chunk={:?}",
            self.rows,
            self.blocks,
            self.heads,
            self.dim,
            self.q.name(),
            self.k.name(),
            self.values,
            self.page_size,
            self.k_blocks,
            self.order.name(),
            self.group,
            self.chunk
        )
    }
    fn scores_spec(&self) -> QsaScoresSpec {
        QsaScoresSpec::new(self.rows, self.blocks).with_heads(self.heads).with_dim(self.dim)
    }
    fn indexer_spec(&self, k: usize) -> QsaIndexerSpec {
        QsaIndexerSpec::new(self.rows, self.blocks)
            .with_heads(self.heads)
            .with_dim(self.dim)
            .with_k_blocks(k)
            .with_order(self.order)
    }
}

/// The cases: every dtype pair, width and head count on small rows (with
/// edges of V), paged keys, the adversarial value families; the fused
/// indexer on decode (1 and 16 rows of 65,536 blocks, one of 262,144), a
/// prefill chunk of mixed V (copy rows beside ranked ones) in forced small
/// groups, and near-ties.
pub fn cases(quick: bool) -> Vec<IndexerCase> {
    let base = |rows, blocks, heads, dim, q, k, values| IndexerCase {
        rows,
        blocks,
        heads,
        dim,
        q,
        k,
        values,
        page_size: None,
        k_blocks: None,
        order: OutputOrder::Index,
        group: None,
        chunk: None,
    };
    let mut out = Vec::new();
    let qs = [DType::F32, DType::BF16];
    let ks = [DType::F32, DType::BF16, DType::F8E4M3];
    let values = [Values::Normal, Values::Ties, Values::Special];
    let mut i = 0;
    for q in qs {
        for k in ks {
            for dim in [64, 128, 256] {
                let heads = [1, 2, 3, 4, 5, 16][i % 6];
                let mut c = base(6, 700, heads, dim, q, k, values[i % 3]);
                c.page_size = (i % 2 == 1).then_some([64, 16, 32][i % 3]);
                out.push(c);
                i += 1;
            }
        }
    }
    // The fused indexer: decode rows, a mixed prefill chunk, ties, pages, score order.
    let decode = [(1usize, 262_144usize, DType::BF16), (16, 65_536, DType::BF16), (1, 65_536, DType::F8E4M3)];
    for (j, &(rows, blocks, k)) in decode.iter().enumerate() {
        if quick && j == 0 {
            continue;
        }
        let mut c = base(rows, blocks, 4, 128, DType::BF16, k, [Values::Normal, Values::Ties, Values::Special][j]);
        c.k_blocks = Some(512);
        c.page_size = (j == 1).then_some(64);
        c.order = if j == 2 { OutputOrder::Score } else { OutputOrder::Index };
        out.push(c);
    }
    for (j, values) in [Values::Normal, Values::Ties].into_iter().enumerate() {
        // 40 consecutive positions around V = k_blocks, in groups of 7 rows.
        let mut c = base(40, 700, 4, 64, DType::F32, DType::BF16, values);
        c.k_blocks = Some(100);
        c.chunk = Some(4 * 100 - 20);
        c.group = Some(7);
        c.page_size = (j == 1).then_some(64);
        c.order = [OutputOrder::Index, OutputOrder::Score][j];
        out.push(c);
    }
    // The fused decode kernel: waves of rows (40 rows of 65,536 blocks: two
    // waves), a relu-zero plateau crossing many CTAs in score order, k at
    // DECODE_MAX_K, paged keys with random V.
    let more = [
        (40usize, 65_536usize, DType::BF16, Values::Normal, None, OutputOrder::Index, 512usize),
        (1, 131_072, DType::F32, Values::Ties, None, OutputOrder::Score, 512),
        (1, 65_536, DType::BF16, Values::Ties, Some(64), OutputOrder::Score, 4096),
        (5, 100_000, DType::F8E4M3, Values::Ties, Some(16), OutputOrder::Index, 1000),
    ];
    for (j, &(rows, blocks, k, values, pages, order, kb)) in more.iter().enumerate() {
        if quick && j == 0 {
            continue;
        }
        let mut c = base(rows, blocks, 4, 128, DType::BF16, k, values);
        c.k_blocks = Some(kb);
        c.page_size = pages;
        c.order = order;
        out.push(c);
    }
    // The fused decode kernel's cluster form (at most
    // DECODE_CLUSTER_MAX_CTAS CTAs a row; each case also runs the grid form
    // of its plan): one CTA, four (the bench's 4,096 tokens), three in score
    // order over ties and pages, sixteen heads of 256 over f32 keys (two
    // head passes), forty rows given three CTAs each instead of four (a CTA
    // an SM), four CTAs of 512 blocks in score order; and the first width
    // past it (nine CTAs: the grid form).
    let clustered = [
        (
            1usize,
            200usize,
            4usize,
            128usize,
            DType::BF16,
            DType::BF16,
            Values::Normal,
            None,
            OutputOrder::Index,
            64usize,
        ),
        (1, 1024, 4, 128, DType::BF16, DType::BF16, Values::Ties, None, OutputOrder::Index, 512),
        (2, 700, 4, 128, DType::BF16, DType::F8E4M3, Values::Ties, Some(64), OutputOrder::Score, 300),
        (3, 1000, 16, 256, DType::F32, DType::F32, Values::Special, None, OutputOrder::Index, 700),
        (40, 1000, 4, 128, DType::BF16, DType::BF16, Values::Normal, Some(16), OutputOrder::Index, 512),
        (4, 2048, 4, 128, DType::BF16, DType::BF16, Values::Ties, Some(64), OutputOrder::Score, 512),
        (2, 2049, 4, 64, DType::F32, DType::BF16, Values::Ties, None, OutputOrder::Index, 512),
    ];
    for (j, &(rows, blocks, heads, dim, q, k, values, pages, order, kb)) in clustered.iter().enumerate() {
        if quick && j == 3 {
            continue;
        }
        let mut c = base(rows, blocks, heads, dim, q, k, values);
        c.k_blocks = Some(kb);
        c.page_size = pages;
        c.order = order;
        out.push(c);
    }
    // Every e4m3 code through each key dtype (the sm_89+ pair conversion
    // and the portable one), one head and four, paged and not.
    for (j, k) in ks.into_iter().enumerate() {
        let mut c = base(5, 700, [1, 4, 1][j], [128, 64, 128][j], qs[j % 2], k, Values::Codes);
        c.page_size = (j == 2).then_some(16);
        c.k_blocks = (j == 2).then_some(100);
        out.push(c);
    }
    // Batches the staged form takes by default (rows of one sequence past a
    // super-group; every case also runs both forms forced): a prefill
    // chunk of bf16 queries, f32 queries over e4m3 keys with two heads,
    // fused with the selection.
    let mut c = base(70, 2000, 4, 128, DType::BF16, DType::BF16, Values::Special);
    c.chunk = Some(4 * 1900);
    out.push(c);
    let mut c = base(45, 1500, 2, 64, DType::F32, DType::F8E4M3, Values::Ties);
    c.chunk = Some(4 * 200 - 30);
    c.k_blocks = Some(256);
    out.push(c);
    // Edge positions and the engine's own grouping, every row ranked or copied.
    let mut c = base(12, 3000, 2, 128, DType::BF16, DType::F32, Values::Ties);
    c.k_blocks = Some(300);
    out.push(c);
    out
}

/// Values of one family (`n` of them), exactly representable in `dtype`.
fn values(v: Values, n: usize, dtype: DType, rng: &mut Rng) -> Vec<f32> {
    let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-40, -1e-40, 0.0, -0.0, 1e30];
    let mut out: Vec<f32> = match v {
        Values::Normal => (0..n).map(|_| rng.normal()).collect(),
        Values::Ties => (0..n).map(|_| rng.below(5) as f32 - 2.0).collect(),
        Values::Special => (0..n)
            .map(|_| if rng.below(50) == 0 { special[rng.below(special.len() as u64) as usize] } else { rng.normal() })
            .collect(),
        Values::Codes => (0..n).map(|i| F8E4M3((i % 256) as u8).to_f32()).collect(),
    };
    if v == Values::Special && dtype == DType::F8E4M3 {
        // e4m3 has no infinities: saturate them.
        for x in &mut out {
            if x.is_infinite() {
                *x = x.signum() * 448.0;
            }
        }
    }
    out
}

/// Queries for f32 keys without infinities (each becomes `+-1e30`): the
/// CUDA engine does not handle an infinite f32 query value beside f32 keys
/// (docs/semantics.md, "The CUDA engine", step 1: it gives NaN where a
/// key's `mid` or `lo` term is zero, as about one random f32 key in 256
/// has), so the check does not ask it to; every other dtype pair keeps its
/// infinite queries.
fn finite_queries(mut q: Vec<f32>) -> Vec<f32> {
    for x in &mut q {
        if x.is_infinite() {
            *x = x.signum() * 1e30;
        }
    }
    q
}

fn to_keys<K: From32>(v: &[f32]) -> Vec<K> {
    v.iter().map(|&x| K::from_f32(x)).collect()
}

/// Rounding of check data into an element type.
trait From32: Sized {
    fn from_f32(x: f32) -> Self;
}
impl From32 for f32 {
    fn from_f32(x: f32) -> Self {
        x
    }
}
impl From32 for bf16 {
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}
impl From32 for F8E4M3 {
    fn from_f32(x: f32) -> Self {
        F8E4M3(crate::ops::mla::f32_to_e4m3(x))
    }
}

/// Positions: edges of V (0, 1, k - 1, k, k + 1, NB - 1, NB blocks) then
/// random, or a chunk.
fn positions_for(c: &IndexerCase, rng: &mut Rng) -> Vec<i64> {
    let (nb, k) = (c.blocks, c.k_blocks.unwrap_or(nb_half(c.blocks)));
    (0..c.rows)
        .map(|i| {
            if let Some(t0) = c.chunk {
                return ((t0 + i) as i64).min((nb * 4 + 3) as i64);
            }
            let edges = [nb, 0, 1, k.saturating_sub(1), k, k + 1, nb.saturating_sub(1)];
            let v = if i < edges.len() && c.rows > 1 { edges[i].min(nb) } else { rng.below(nb as u64 + 1) as usize };
            let v = if c.rows == 1 || c.rows == 16 { nb } else { v };
            (v * 4 + (i % 4)).max(1) as i64 - 1
        })
        .collect()
}

fn nb_half(nb: usize) -> usize {
    nb / 2
}

/// The first device score outside the CUDA engine's stated bound of the
/// float64 reference (`m`: each entry's magnitude): a NaN reference wants
/// the canonical NaN, an infinite one the same infinity, and entries whose
/// magnitude reaches 2^127 (outside the bound's range, where f32 products
/// may overflow) are not compared; an infinite reference may come out NaN
/// where the finite values' magnitudes (`fm`) reach 2^127 (an overflowed
/// f32 product of the other sign beside the infinite one).
fn first_over(
    want: &[f64],
    m: &[f64],
    fm: &[f64],
    got: &[f32],
    spec: &QsaScoresSpec,
    q: DType,
    k: DType,
) -> Option<String> {
    let blocks = spec.blocks;
    let i = want.iter().zip(m).zip(fm).zip(got).position(|(((&w, &m), &fm), &g)| {
        let ok = if w.is_nan() || m.is_nan() {
            g.to_bits() == 0x7fc0_0000
        } else if w.is_infinite() {
            g as f64 == w || (fm >= 2f64.powi(127) && g.to_bits() == 0x7fc0_0000)
        } else if m >= 2f64.powi(127) {
            true
        } else {
            (g as f64 - w).abs() <= super::device_error_bound(spec, m, q, k)
        };
        !ok
    })?;
    Some(format!(
        "score [{}, {}]: reference {:e}, gpu {:e} ({:#x}), bound {:e}",
        i / blocks,
        i % blocks,
        want[i],
        got[i],
        got[i].to_bits(),
        super::device_error_bound(spec, m[i], q, k)
    ))
}

fn run_typed<Q: QueryElem + From32, K: KeyElem + From32>(
    e: &CudaEngine,
    c: &IndexerCase,
    rng: &mut Rng,
) -> Result<(bool, String)> {
    let spec = c.scores_spec();
    let positions = positions_for(c, rng);
    let qv = match c.values {
        // One-hot: row r's head h reads dimension (r * H + h) % d.
        Values::Codes => (0..spec.q_len()?)
            .map(|i| {
                let (rh, d) = (i / c.dim, i % c.dim);
                if d == rh % c.dim {
                    1.0
                } else {
                    0.0
                }
            })
            .collect(),
        v => values(v, spec.q_len()?, c.q, rng),
    };
    let qv = if c.q == DType::F32 && c.k == DType::F32 { finite_queries(qv) } else { qv };
    let q: Vec<Q> = to_keys(&qv);
    let paged = c.page_size.map(|ps| {
        let (t, max_pages, seq) = pages_for(rng, c.rows, c.blocks * 4 + 4, ps);
        (t, max_pages, ps, seq)
    });
    let map = match &paged {
        Some((t, max_pages, ps, seq)) => Some(PageMap::new(t, *max_pages, *ps, seq)?),
        None => None,
    };
    // A paged cache holds every page the table names (a permutation).
    let key_rows = match &paged {
        Some((t, _, ps, _)) => t.len() * (ps / 4),
        None => c.blocks,
    };
    let kv = values(c.values, key_rows * c.dim, c.k, rng);
    let kbar: Vec<K> = to_keys(&kv);
    let keys = match &map {
        Some(m) => BlockKeys::Paged { kbar: &kbar, pages: *m },
        None => BlockKeys::Contiguous(&kbar),
    };
    let got = e.qsa_scores_host(&q, &keys, &positions, &spec)?;
    // The same bits from both score forms (each forced; the default took one).
    let dev = e.props();
    let mut forms = vec![ScoreForm::Plain];
    if let Some(g) = staged_geometry_on(c.q, c.k, c.dim, &dev) {
        forms.push(ScoreForm::Staged(g));
    }
    for form in forms {
        let (other, _) = e.time_qsa_scores_as(&q, &keys, &positions, &spec, 0, Some(form))?;
        if let Some(i) = other.iter().zip(&got).position(|(a, g)| a.to_bits() != g.to_bits()) {
            let (r, b) = (i / spec.blocks, i % spec.blocks);
            return Ok((
                false,
                format!("{form:?}: score [{r}, {b}] {:e} against {:e} by the default form", other[i], got[i]),
            ));
        }
    }
    // Within the bound of the float64 reference; M by the same reference
    // over |q| and |kbar| (relu keeps the non-negative dots).
    let want = super::reference_qsa_scores(&q, &keys, &positions, &spec)?;
    let (qa, ka): (Vec<Q>, Vec<K>) = (to_keys(&abs(&qv)), to_keys(&abs(&kv)));
    let keys_abs = match &map {
        Some(m) => BlockKeys::Paged { kbar: &ka, pages: *m },
        None => BlockKeys::Contiguous(&ka),
    };
    let mags = super::reference_qsa_scores(&qa, &keys_abs, &positions, &spec)?;
    // The finite values' magnitudes alone (infinities and NaN as 0): where
    // they reach 2^127 an f32 product may overflow beside an infinite one.
    let finite = |v: &[f32]| -> Vec<f32> { v.iter().map(|x| if x.is_finite() { x.abs() } else { 0.0 }).collect() };
    let (qf, kf): (Vec<Q>, Vec<K>) = (to_keys(&finite(&qv)), to_keys(&finite(&kv)));
    let keys_finite = match &map {
        Some(m) => BlockKeys::Paged { kbar: &kf, pages: *m },
        None => BlockKeys::Contiguous(&kf),
    };
    let finite_mags = super::reference_qsa_scores(&qf, &keys_finite, &positions, &spec)?;
    if let Some(d) = first_over(&want, &mags, &finite_mags, &got, &spec, c.q, c.k) {
        return Ok((false, d));
    }
    // The same bits for a row scored alone (the first and the last).
    let hd = spec.heads * spec.dim;
    for r in [0, c.rows - 1] {
        let seq_one = paged.as_ref().map(|p| p.3[r..r + 1].to_vec());
        let map_one = match (&paged, &seq_one) {
            (Some((t, max_pages, ps, _)), Some(seq)) => Some(PageMap::new(t, *max_pages, *ps, seq)?),
            _ => None,
        };
        let keys_one = match &map_one {
            Some(m) => BlockKeys::Paged { kbar: &kbar, pages: *m },
            None => BlockKeys::Contiguous(&kbar),
        };
        let one = QsaScoresSpec { rows: 1, ..spec };
        let alone = e.qsa_scores_host(&q[r * hd..(r + 1) * hd], &keys_one, &positions[r..r + 1], &one)?;
        let row = &got[r * spec.blocks..(r + 1) * spec.blocks];
        if let Some(b) = alone.iter().zip(row).position(|(a, g)| a.to_bits() != g.to_bits()) {
            return Ok((false, format!("row {r} alone: block {b} {:e} against {:e} in the batch", alone[b], row[b])));
        }
    }
    let Some(k) = c.k_blocks else { return Ok((true, String::new())) };
    let ispec = c.indexer_spec(k);
    // The unfused chain over the device's scores: on the CPU and on the device.
    let view = ScoresView::new(&got, c.rows, c.blocks)?;
    let host_chain = crate::ops::qsa::qsa_select(&view, &positions, &ispec.select_spec(), map.as_ref())?;
    let chain = e.qsa_select_host(&view, &positions, &ispec.select_spec(), map.as_ref())?;
    for path in case_paths(e, c, &ispec) {
        let (fused, _) = e.time_qsa_indexer_on(&q, &keys, &positions, &ispec, map.as_ref(), 0, path)?;
        let (ok, d) = crate::ops::qsa::check::compare(&chain, &fused);
        if !ok {
            return Ok((false, format!("{path:?} vs device chain: {d}")));
        }
        let (ok, d) = crate::ops::qsa::check::compare(&host_chain, &fused);
        if !ok {
            return Ok((false, format!("{path:?} vs qsa_select on the cpu over the device scores: {d}")));
        }
    }
    Ok((true, String::new()))
}

fn abs(v: &[f32]) -> Vec<f32> {
    v.iter().map(|x| x.abs()).collect()
}

/// The device indexer paths a case runs: the grouped path of `rows` rows,
/// and the fused decode kernel where its plan takes the shape (a cluster
/// plan also in the grid form, the same geometry).
fn paths_of(e: &CudaEngine, rows: usize, ispec: &QsaIndexerSpec) -> Vec<IndexerPath> {
    let mut out = vec![IndexerPath::Grouped { rows }];
    if let Some(p) = decode_plan(ispec, &e.props()) {
        out.push(IndexerPath::Decode(p));
        if p.cluster {
            out.push(IndexerPath::Decode(p.with_cluster(false)));
        }
    }
    out
}

/// A case's paths: [`paths_of`] with the case's groups, or the engine's.
fn case_paths(e: &CudaEngine, c: &IndexerCase, ispec: &QsaIndexerSpec) -> Vec<IndexerPath> {
    paths_of(e, c.group.unwrap_or_else(|| super::device::indexer_group_rows(ispec)), ispec)
}

/// Runs one case with fresh data from `rng`.
pub fn run_case(e: &CudaEngine, c: &IndexerCase, rng: &mut Rng) -> Result<Outcome> {
    let path = match c.k_blocks {
        Some(k) => {
            let s = c.indexer_spec(k);
            let g = c.group.unwrap_or_else(|| super::device::indexer_group_rows(&s));
            e.plan(&crate::ops::qsa::QsaSpec { rows: g, ..s.select_spec() }.block_spec_of(DType::F32), true)?.path()
        }
        None => Path::Row,
    };
    let (ok, detail) = match (c.q, c.k) {
        (DType::F32, DType::F32) => run_typed::<f32, f32>(e, c, rng)?,
        (DType::F32, DType::BF16) => run_typed::<f32, bf16>(e, c, rng)?,
        (DType::F32, _) => run_typed::<f32, F8E4M3>(e, c, rng)?,
        (_, DType::F32) => run_typed::<bf16, f32>(e, c, rng)?,
        (_, DType::BF16) => run_typed::<bf16, bf16>(e, c, rng)?,
        _ => run_typed::<bf16, F8E4M3>(e, c, rng)?,
    };
    let decode = c.k_blocks.and_then(|k| decode_plan(&c.indexer_spec(k), &e.props()));
    let sequences = if c.page_size.is_some() { c.rows.div_ceil(2).max(1) } else { 1 };
    let form = match super::device::score_form(&c.scores_spec(), c.q, c.k, sequences, &e.props()) {
        ScoreForm::Plain => "plain",
        ScoreForm::Staged(_) => "staged",
    };
    let case = match decode {
        Some(p) => format!(
            "{} scores={form} decode={}x{}{}",
            c.describe(),
            p.ctas,
            p.slots,
            if p.cluster { " (clusters; also the grid form)" } else { "" }
        ),
        None => format!("{} scores={form}", c.describe()),
    };
    Ok(Outcome {
        case,
        path,
        ctas_per_row: decode.map_or(0, |p| p.ctas as u32),
        grid_items: 0,
        short_kernel: None,
        ok,
        detail,
    })
}

/// The name of [`bad_values_check`].
pub fn bad_values_case() -> String {
    "indexer device values out of range (positions, sequences, page counts, page entries)".into()
}

/// Device values out of range, straight through the device entry points:
/// rows with a negative position, `V > NB` or a sequence outside the table
/// come out all NaN (scores) and all padding with count 0 (indexer); a page
/// entry outside the cache scores NaN; the good rows beside them are the
/// device's bytes for the same rows alone on a clean cache.
pub fn bad_values_check(e: &CudaEngine, rng: &mut Rng) -> Result<Outcome> {
    let (blocks, dim, heads, ps) = (64usize, 64usize, 2usize, 16usize); // 4 blocks a page
    let per_page = ps / 4;
    let spec = QsaScoresSpec::new(7, blocks).with_heads(heads).with_dim(dim);
    let sequences = 2;
    let max_pages = blocks / per_page; // exactly enough for V = NB
    let cache_pages = sequences * max_pages;
    let mut table: Vec<i32> = (0..cache_pages as i32).collect();
    table[max_pages + 3] = cache_pages as i32 + 5; // sequence 1, page 3: outside the cache
                                                   // Rows: good, negative position, V > NB, sequence -1, sequence 2 (past),
                                                   // good on sequence 1 (one bad page), V = NB exactly.
    let positions: Vec<i32> = vec![99, -5, (blocks as i32 + 1) * 4, 50, 50, 255, (blocks * 4 - 1) as i32];
    let seq_ids: Vec<i32> = vec![0, 0, 0, -1, 2, 1, 0];
    let q: Vec<f32> = (0..spec.q_len()?).map(|_| rng.normal()).collect();
    let kbar: Vec<f32> = (0..cache_pages * per_page * dim).map(|_| rng.normal()).collect();
    let s = e.stream();
    let up_f = |v: &[f32]| s.clone_htod(v).map_err(cuda_err);
    let up_i = |v: &[i32]| s.clone_htod(v).map_err(cuda_err);
    let (dq, dk, dpos, dtab, dseq) = (up_f(&q)?, up_f(&kbar)?, up_i(&positions)?, up_i(&table)?, up_i(&seq_ids)?);
    let out: CudaSlice<f32> = s.alloc_zeros(spec.out_len()?).map_err(cuda_err)?;
    let pages =
        DevicePages { table: dtab.device_ptr(s).0, sequences, max_pages, page_size: ps, seq_ids: dseq.device_ptr(s).0 };
    let keys = DeviceBlockKeys { dtype: DType::F32, kbar: dk.device_ptr(s).0, pages: Some(pages), cache_pages };
    let args = DeviceQsaScores {
        spec,
        q_dtype: DType::F32,
        q: dq.device_ptr(s).0,
        keys,
        positions: dpos.device_ptr(s).0,
        out: out.device_ptr(s).0,
        stream: s.cu_stream() as u64,
    };
    // SAFETY: every buffer is sized for the spec and the table.
    unsafe {
        crate::cuda::launch::poison(args.out, 0x5a, spec.out_len()? * 4, s.cu_stream())?;
        e.qsa_scores_device(&args)?;
    }
    let got = s.clone_dtoh(&out).map_err(cuda_err)?;
    s.synchronize().map_err(cuda_err)?;
    let row = |r: usize| &got[r * blocks..(r + 1) * blocks];
    let nan = |x: &f32| x.to_bits() == 0x7fc0_0000;
    let mut bad = Vec::new();
    for r in [1, 2, 3, 4] {
        if !row(r).iter().all(nan) {
            bad.push(format!("row {r} is not all NaN"));
        }
    }
    // Good rows: the device's bytes for each row alone on a cache without the bad entry.
    let mut fixed = table.clone();
    fixed[max_pages + 3] = 0;
    for r in [0, 5, 6] {
        let one = QsaScoresSpec { rows: 1, ..spec };
        let one_map = PageMap::new(&fixed, max_pages, ps, &seq_ids[r..r + 1])?;
        let want = e.qsa_scores_host(
            &q[r * heads * dim..(r + 1) * heads * dim],
            &BlockKeys::Paged { kbar: &kbar, pages: one_map },
            &[positions[r] as i64],
            &one,
        )?;
        for (b, (&w, &g)) in want.iter().zip(row(r)).enumerate() {
            let bad_page = r == 5 && b / per_page == 3;
            let ok = if bad_page { nan(&g) } else { w.to_bits() == g.to_bits() };
            if !ok {
                bad.push(format!("row {r} block {b}: want {w:e}{}, got {g:e}", if bad_page { " (NaN)" } else { "" }));
                break;
            }
        }
    }
    // The fused indexer over the same buffers (k_blocks 8: rows 0, 5 and 6 ranked).
    let ispec = QsaIndexerSpec::new(7, blocks).with_heads(heads).with_dim(dim).with_k_blocks(8);
    let width = ispec.width();
    let ids: CudaSlice<i32> = s.alloc_zeros(7 * width).map_err(cuda_err)?;
    let counts: CudaSlice<i32> = s.alloc_zeros(7).map_err(cuda_err)?;
    for path in paths_of(e, 7, &ispec) {
        let wb = e.qsa_indexer_workspace_bytes_on(&ispec, path)?;
        let ws: CudaSlice<u8> = s.alloc_zeros(wb.max(256)).map_err(cuda_err)?;
        let iargs = super::DeviceQsaIndexer {
            spec: ispec,
            q_dtype: DType::F32,
            q: args.q,
            keys,
            positions: args.positions,
            ids: ids.device_ptr(s).0,
            counts: Some(counts.device_ptr(s).0),
            slots: None,
            workspace: ws.device_ptr(s).0,
            workspace_bytes: wb,
            stream: args.stream,
        };
        // SAFETY: as above; outputs sized for the spec.
        unsafe {
            crate::cuda::launch::poison(iargs.ids, 0x5a, 7 * width * 4, s.cu_stream())?;
            crate::cuda::launch::poison(counts.device_ptr(s).0, 0x5a, 7 * 4, s.cu_stream())?;
            e.qsa_indexer_device_on(&iargs, path)?;
        }
        let h_ids = s.clone_dtoh(&ids).map_err(cuda_err)?;
        let h_counts = s.clone_dtoh(&counts).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        for r in [1, 2, 3, 4] {
            if h_counts[r] != 0 || h_ids[r * width..(r + 1) * width].iter().any(|&x| x != -1) {
                bad.push(format!("indexer {path:?} row {r}: count {}, not all padding", h_counts[r]));
            }
        }
        for r in [0, 6] {
            let one_map = PageMap::new(&fixed, max_pages, ps, &seq_ids[r..r + 1])?;
            // qsa_select on the CPU over the device's scores of the clean cache.
            let one = QsaScoresSpec { rows: 1, ..spec };
            let pos = [positions[r] as i64];
            let sc = e.qsa_scores_host(
                &q[r * heads * dim..(r + 1) * heads * dim],
                &BlockKeys::Paged { kbar: &kbar, pages: one_map },
                &pos,
                &one,
            )?;
            let view = ScoresView::new(&sc, 1, blocks)?;
            let want =
                crate::ops::qsa::qsa_select(&view, &pos, &QsaIndexerSpec { rows: 1, ..ispec }.select_spec(), None)?;
            if want.counts[0] != h_counts[r] || want.ids[..] != h_ids[r * width..(r + 1) * width] {
                bad.push(format!("indexer {path:?} row {r} differs from qsa_select over the device's scores"));
            }
        }
    }
    let ok = bad.is_empty();
    Ok(Outcome {
        case: bad_values_case(),
        path: Path::Row,
        ctas_per_row: 0,
        grid_items: 0,
        short_kernel: None,
        ok,
        detail: bad.join("; "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every case's inputs pass the host checks (the CPU half of each case
    /// runs: the GPU half is `flashsel check`'s).
    #[test]
    fn cases_pass_the_host_checks() {
        let mut rng = Rng::new(7);
        for c in cases(false).iter().filter(|c| c.rows * c.blocks <= 1 << 16) {
            let spec = c.scores_spec();
            let positions = positions_for(c, &mut rng);
            let q: Vec<f32> = values(c.values, spec.q_len().unwrap(), c.q, &mut rng);
            let kbar: Vec<f32> = values(c.values, c.blocks * c.dim, c.k, &mut rng);
            let s = super::super::qsa_scores(&q, &BlockKeys::Contiguous(&kbar), &positions, &spec);
            assert!(s.is_ok(), "{}: {:?}", c.describe(), s.err());
            if let Some(k) = c.k_blocks {
                let r =
                    super::super::qsa_indexer(&q, &BlockKeys::Contiguous(&kbar), &positions, &c.indexer_spec(k), None);
                assert!(r.is_ok(), "{}: {:?}", c.describe(), r.err());
            }
        }
        assert!(cases(true).len() < cases(false).len());
    }
}
