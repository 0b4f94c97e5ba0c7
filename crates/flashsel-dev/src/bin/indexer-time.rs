//! Times qsa_scores / qsa_indexer on issue 22's shapes (a developer run; the
//! bench rows are `flashsel bench --only indexer`). `indexer-time TEXT` runs
//! only the shapes whose name contains TEXT; `indexer-time sweep` the decode
//! planner's crossover; `indexer-time clusters` (or `clusters 1 x 4096`,
//! one of its shapes) the fused decode kernel's cluster form beside its grid
//! form; `indexer-time groups` the prefill shape's grouped path at 256 to
//! 8,192 rows a group.
use flashsel::contract::DType;
use flashsel::cuda::CudaEngine;
use flashsel::data::Rng;
use flashsel::ops::indexer::device::{
    indexer_group_rows, score_form, DecodePlan, IndexerPath, ScoreForm, DECODE_CLUSTER_MAX_CTAS,
};
use flashsel::ops::indexer::{BlockKeys, KeyElem, PageMap, QsaIndexerSpec, QsaScoresSpec, F8E4M3};
use half::bf16;

fn med(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2] * 1e6
}

struct Shape<'a> {
    name: &'a str,
    rows: usize,
    tokens: usize,
    paged: bool,
    prefill: bool,
    verify: bool,
}

fn run<K: KeyElem>(e: &CudaEngine, s: &Shape<'_>, mk: impl Fn(f32) -> K, bw: f64) {
    // `indexer-time TEXT`: only the shapes whose name contains TEXT (for a
    // profiler run of one shape).
    if let Some(only) = std::env::args().nth(1) {
        if only != "sweep" && only != "groups" && !s.name.contains(&only) {
            return;
        }
    }
    let mut rng = Rng::new(5);
    let (rows, nb) = (s.rows, s.tokens / 4);
    let (h, d) = (4, 128);
    let q: Vec<bf16> = (0..rows * h * d).map(|_| bf16::from_f32(rng.normal())).collect();
    let positions: Vec<i64> = if s.prefill {
        (0..rows).map(|i| (s.tokens - rows + i) as i64).collect()
    } else {
        vec![s.tokens as i64 - 1; rows]
    };
    let (ps, per_page) = (64, 16);
    let seqs = if s.paged { rows } else { 1 };
    let max_pages = nb.div_ceil(per_page);
    let table: Vec<i32> = (0..(seqs * max_pages) as i32).collect();
    let seq_ids: Vec<i32> = (0..rows as i32).map(|r| if s.paged { r } else { 0 }).collect();
    let key_rows = if s.paged { seqs * max_pages * per_page } else { nb };
    let kbar: Vec<K> = (0..key_rows * d).map(|_| mk(rng.normal())).collect();
    let map = PageMap::new(&table, max_pages, ps, &seq_ids).unwrap();
    let keys = if s.paged { BlockKeys::Paged { kbar: &kbar, pages: map } } else { BlockKeys::Contiguous(&kbar) };
    let sspec = QsaScoresSpec::new(rows, nb);
    let ispec = QsaIndexerSpec::new(rows, nb);
    let (s_gpu, ts) = e.time_qsa_scores(&q, &keys, &positions, &sspec, 30).unwrap();
    // Where the default form is the staged one, the plain form beside it
    // (the same bytes).
    let form = score_form(&sspec, DType::BF16, K::DTYPE, seqs, &e.props());
    let mut plain = String::new();
    if form != ScoreForm::Plain {
        let (s_plain, tp) = e.time_qsa_scores_as(&q, &keys, &positions, &sspec, 30, Some(ScoreForm::Plain)).unwrap();
        let same = s_plain.iter().zip(&s_gpu).all(|(a, b)| a.to_bits() == b.to_bits());
        plain = format!("  plain scores {:>9.2} us{}", med(tp), if same { "" } else { " MISMATCH" });
    }
    let (i_gpu, ti) = e.time_qsa_indexer(&q, &keys, &positions, &ispec, None, 30).unwrap();
    // Where the default is the fused decode kernel, the grouped path beside it.
    let path = e.qsa_indexer_path(&ispec);
    let grouped = IndexerPath::Grouped { rows: indexer_group_rows(&ispec) };
    let mut other = String::new();
    if path != grouped {
        let (i_grp, tg) = e.time_qsa_indexer_on(&q, &keys, &positions, &ispec, None, 30, grouped).unwrap();
        other = format!("  grouped {:>9.2} us{}", med(tg), if i_grp == i_gpu { "" } else { " MISMATCH" });
    }
    // `groups`: the grouped path at other group sizes (rows; the default's
    // are indexer_group_rows'), to size the scratch bound.
    if std::env::args().nth(1).as_deref() == Some("groups") {
        for g in [256usize, 512, 1024, 2048, 4096, 8192] {
            let alt = IndexerPath::Grouped { rows: g.min(rows) };
            let (i_alt, ta) = e.time_qsa_indexer_on(&q, &keys, &positions, &ispec, None, 30, alt).unwrap();
            other += &format!("  g{g} {:>8.2}{}", med(ta), if i_alt == i_gpu { "" } else { " MISMATCH" });
        }
    }
    // The fused decode kernel's other form at the same geometry (the grid
    // form beside a cluster plan; the cluster form beside a grid plan of at
    // most DECODE_CLUSTER_MAX_CTAS CTAs a row on a device with clusters).
    if let IndexerPath::Decode(p) = path {
        if p.cluster || (p.ctas <= DECODE_CLUSTER_MAX_CTAS && e.props().clusters) {
            let alt = IndexerPath::Decode(p.with_cluster(!p.cluster));
            let (i_alt, ta) = e.time_qsa_indexer_on(&q, &keys, &positions, &ispec, None, 30, alt).unwrap();
            let form = if p.cluster { "grid form" } else { "cluster form" };
            other += &format!("  {form} {:>9.2} us{}", med(ta), if i_alt == i_gpu { "" } else { " MISMATCH" });
        }
        // `clusters`: the cluster form at 1, 2 and 4 CTAs a row too.
        if s.name.starts_with("clusters") && e.props().clusters {
            for ctas in [1usize, 2, 4] {
                let tile_cap = nb.div_ceil(ctas).next_multiple_of(8);
                let smem = p.smem - 4 * p.tile_cap + 4 * tile_cap;
                let alt = IndexerPath::Decode(DecodePlan { ctas, tile_cap, smem, cluster: true, ..p });
                if let Ok((i_alt, ta)) = e.time_qsa_indexer_on(&q, &keys, &positions, &ispec, None, 30, alt) {
                    other += &format!("  c{ctas} {:>7.2}{}", med(ta), if i_alt == i_gpu { "" } else { " MISMATCH" });
                }
            }
        }
    }
    let mut ok = "unverified".to_string();
    if s.verify {
        // The fused call against qsa_select on the CPU over the device's scores.
        let view = flashsel::ScoresView::new(&s_gpu, rows, nb).unwrap();
        let chain = flashsel::cpu::qsa_select(&view, &positions, &ispec.select_spec(), None).unwrap();
        ok = format!("indexer {}", if chain == i_gpu { "ok" } else { "MISMATCH" });
    }
    // Digests of the scores' and the ids' bytes, to compare runs of one
    // shape across kernel variants.
    let fnv = |words: &mut dyn Iterator<Item = u32>| {
        words.fold(0xcbf2_9ce4_8422_2325u64, |h, w| (h ^ w as u64).wrapping_mul(0x100_0000_01b3))
    };
    let digest = format!(
        "scores#{:016x} ids#{:016x}",
        fnv(&mut s_gpu.iter().map(|x| x.to_bits())),
        fnv(&mut i_gpu.ids.iter().map(|&x| x as u32))
    );
    let per_row = (nb * d * std::mem::size_of::<K>()) as f64;
    let key_bytes = if s.paged { per_row * rows as f64 } else { per_row };
    println!(
        "INDEXER {:<34} scores {:>9.2} us{plain}  indexer {:>9.2} us{other}  floor {:>8.2} us  {ok}  {path:?}  {form:?}  {digest}",
        s.name,
        med(ts),
        med(ti),
        key_bytes / bw * 1e6
    );
}

fn main() {
    let e = CudaEngine::new(0).unwrap();
    e.warm_up().unwrap();
    let bw = e.copy_bandwidth(1 << 30).unwrap();
    println!("copy bandwidth {:.2} TB/s", bw / 1e12);
    let b = |x: f32| bf16::from_f32(x);
    let f8 = |x: f32| F8E4M3(flashsel::ops::mla::f32_to_e4m3(x));
    let sh = |name, rows, tokens, paged, prefill, verify| Shape { name, rows, tokens, paged, prefill, verify };
    if std::env::args().nth(1).as_deref() == Some("sweep") {
        // The decode planner's crossover: the fused kernel beside the grouped
        // path over rows, depth and key dtype.
        for rows in [1usize, 4, 16] {
            for tokens in [131_072usize, 262_144, 524_288, 1 << 20] {
                if rows * tokens > 1 << 24 {
                    continue;
                }
                let name: &'static str = Box::leak(format!("sweep {rows} x {tokens}").into_boxed_str());
                run(&e, &sh(name, rows, tokens, rows > 1, false, false), b, bw);
                let name: &'static str = Box::leak(format!("sweep {rows} x {tokens} fp8").into_boxed_str());
                run(&e, &sh(name, rows, tokens, rows > 1, false, false), f8, bw);
            }
        }
        return;
    }
    if std::env::args().nth(1).as_deref() == Some("groups") {
        run(&e, &sh("prefill 8192 at 254K..262K bf16", 8192, 262_144, false, true, false), b, bw);
        return;
    }
    if std::env::args().nth(1).is_some_and(|a| a.starts_with("clusters")) {
        // The fused decode kernel's cluster form beside its grid form.
        for (rows, tokens) in
            [(1usize, 1024usize), (1, 4096), (1, 8192), (2, 4096), (4, 4096), (8, 4096), (16, 8192), (64, 4096)]
        {
            let name: &'static str = Box::leak(format!("clusters {rows} x {tokens}").into_boxed_str());
            run(&e, &sh(name, rows, tokens, rows > 1, false, true), b, bw);
        }
        for (rows, tokens) in [(1usize, 65_536usize), (4, 65_536), (32, 131_072)] {
            let name: &'static str = Box::leak(format!("clusters {rows} x {tokens}").into_boxed_str());
            run(&e, &sh(name, rows, tokens, true, false, false), b, bw);
        }
        return;
    }
    run(&e, &sh("decode 1 x 4096 bf16", 1, 4096, false, false, true), b, bw);
    run(&e, &sh("decode 1 x 131072 bf16", 1, 131_072, false, false, true), b, bw);
    run(&e, &sh("decode 1 x 1048576 bf16", 1, 1 << 20, false, false, true), b, bw);
    run(&e, &sh("decode 1 x 1048576 fp8", 1, 1 << 20, false, false, true), f8, bw);
    run(&e, &sh("decode 16 x 1048576 bf16 paged", 16, 1 << 20, true, false, false), b, bw);
    run(&e, &sh("decode 32 x 131072 bf16 paged", 32, 131_072, true, false, true), b, bw);
    run(&e, &sh("prefill 8192 at 254K..262K bf16", 8192, 262_144, false, true, false), b, bw);
}
