use super::*;
use crate::contract::DType;
use crate::ops::select::SelectSpec;

fn h200() -> DeviceProps {
    DeviceProps::hopper(132)
}

const NO_GRID: PathOptions = PathOptions {
    grid: false,
    grid_min_chunk: None,
    grid_place_max: GRID_PLACE_MAX,
    grid_small_items: true,
    short: true,
    short_warp_cols: SHORT_WARP_COLS,
    short_warp_min_rows: SHORT_WARP_MIN_ROWS,
    short_wide_cols: SHORT_WIDE_COLS,
    short_cluster: true,
};
const NO_SHORT: PathOptions = PathOptions {
    grid: true,
    grid_min_chunk: None,
    grid_place_max: GRID_PLACE_MAX,
    grid_small_items: true,
    short: false,
    short_warp_cols: SHORT_WARP_COLS,
    short_warp_min_rows: SHORT_WARP_MIN_ROWS,
    short_wide_cols: SHORT_WIDE_COLS,
    short_cluster: true,
};
/// The short path's CTA kernel only (the warp kernel off).
const CTA: PathOptions = PathOptions {
    grid: true,
    grid_min_chunk: None,
    grid_place_max: GRID_PLACE_MAX,
    grid_small_items: true,
    short: true,
    short_warp_cols: 0,
    short_warp_min_rows: SHORT_WARP_MIN_ROWS,
    short_wide_cols: SHORT_WIDE_COLS,
    short_cluster: true,
};
/// The warp kernel at its column bound for any batch the short path takes.
const WARP_ANY_ROWS: PathOptions = PathOptions { short_warp_min_rows: 0, ..CTA_WITH_WARP };
const CTA_WITH_WARP: PathOptions = PathOptions { short_warp_cols: SHORT_WARP_COLS, ..CTA };

fn p(rows: usize, cols: usize, k: usize) -> Plan {
    plan(&SelectSpec::new(rows, cols, k, DType::F32), false, &h200()).unwrap()
}
/// [`p`] in index order.
fn pi(rows: usize, cols: usize, k: usize) -> Plan {
    plan(&SelectSpec::new(rows, cols, k, DType::F32).with_order(OutputOrder::Index), false, &h200()).unwrap()
}

#[test]
fn fit_boundaries_for_one_row() {
    // The row / grid boundaries with the short path off (a single row of
    // at most SHORT_WIDE_COLS takes its wide kernel by default).
    let ns = |cols, k| plan_with(&SelectSpec::new(1, cols, k, DType::F32), false, &h200(), &NO_SHORT).unwrap();
    for k in [512usize, 2048] {
        let fit = (4 * k).max(8192);
        assert_eq!(p(1, 8, k).fit() as usize, fit);
        assert_eq!(fit as u64, SHORT_COLS);
        for cols in [fit - 1, fit] {
            assert_eq!(pi(1, cols, k).short().map(|s| s.kernel), Some(ShortKernel::Wide), "1 x {cols}, k {k}");
            assert_eq!(p(1, cols, k), ns(cols, k), "score order: no wide kernel");
            let pl = ns(cols, k);
            assert_eq!((pl.path(), pl.ctas_per_row(), pl.merge_levels()), (Path::Row, 1, 0), "1 x {cols}, k {k}");
        }
        for cols in [fit + 1, 2 * fit - 1] {
            let pl = ns(cols, k);
            assert_eq!(pl.path(), Path::Row, "1 x {cols}, k {k}");
            assert_eq!((pl.ctas_per_row(), pl.merge_levels()), (1, 0));
            assert_eq!(pl.workspace_bytes(), 0);
        }
        // Two fits: the grid path for k 512 (one CTA per grid_min_chunk(f32)
        // = 2048 columns: 8); for k 2048 its placement bound (k^2 <=
        // GRID_PLACE_MAX x 8 CTAs) fails and the row splits.
        let pl = ns(2 * fit, k);
        let want = if k == 512 { (Path::Grid, 8, 0) } else { (Path::Split, 2, 1) };
        assert_eq!((pl.path(), pl.ctas_per_row(), pl.merge_levels()), want);
        // Without it (grid=0), the split the geometry took before.
        let no_grid = PathOptions { short: false, ..NO_GRID };
        let pl = plan_with(&SelectSpec::new(1, 2 * fit, k, DType::F32), false, &h200(), &no_grid).unwrap();
        assert_eq!((pl.path(), pl.ctas_per_row(), pl.merge_levels()), (Path::Split, 2, 1));
    }
}

#[test]
fn wide_rows_never_run_on_one_cta() {
    // The seed-003 geometry: 1 x 262,144, k 512: 128 CTAs of 2048 columns
    // (f32), 64 of 4096 (bf16).
    let pl = p(1, 262_144, 512);
    assert_eq!((pl.path(), pl.buffer(), pl.ctas_per_row(), pl.merge_levels()), (Path::Grid, Buffer::Shared, 128, 0));
    let pl = plan(&SelectSpec::new(1, 262_144, 512, DType::BF16), false, &h200()).unwrap();
    assert_eq!((pl.path(), pl.ctas_per_row(), pl.merge_levels()), (Path::Grid, 64, 0));
    let pl = p(1, 1_048_576, 2048);
    assert_eq!((pl.path(), pl.ctas_per_row(), pl.merge_levels()), (Path::Grid, 132, 0));
    let no_grid = |cols, k| plan_with(&SelectSpec::new(1, cols, k, DType::F32), false, &h200(), &NO_GRID).unwrap();
    let pl = no_grid(262_144, 512);
    assert_eq!((pl.path(), pl.ctas_per_row(), pl.merge_levels()), (Path::Split, 32, 1));
    let pl = no_grid(1_048_576, 2048);
    assert_eq!((pl.path(), pl.ctas_per_row(), pl.merge_levels()), (Path::Split, 128, 1));
    let pl = p(1, 4_194_304, 2048);
    assert_eq!((pl.path(), pl.ctas_per_row(), pl.merge_levels()), (Path::Split, 132, 1));
    let pl = p(1, 4_194_304, 512);
    assert_eq!((pl.path(), pl.ctas_per_row(), pl.merge_levels()), (Path::Split, 132, 1));
}

#[test]
fn grid_path_boundaries() {
    let edge = 132 * GRID_CHUNK as usize;
    // A chunk of exactly GRID_CHUNK columns fits the registers; one more does not.
    assert_eq!((p(1, edge, 2048).path(), p(1, edge, 2048).ctas_per_row()), (Path::Grid, 132));
    assert_eq!(p(1, edge + 1, 2048).path(), Path::Split);
    // k up to GRID_MAX_K.
    assert_eq!(p(1, 1 << 20, GRID_MAX_K as usize).path(), Path::Grid);
    assert_eq!(p(1, 1 << 20, GRID_MAX_K as usize + 1).path(), Path::Split);
    // The placement bound k^2 <= GRID_PLACE_MAX x ctas_per_row: 8 rows of
    // 65,536 get 16 CTAs each (chunks of 4096): k 1448 fits, k 1449 not.
    assert_eq!((p(8, 65_536, 1448).path(), p(8, 65_536, 1448).ctas_per_row()), (Path::Grid, 16));
    assert_eq!(p(8, 65_536, 1449).path(), Path::Split);
    // 1 x 65,536, k 2048: f32 on 32 grid CTAs of 2048 (k^2 <= GRID_PLACE_MAX
    // x 32; 13.0 us against 14.2 split), bf16 (16 CTAs of 4096) splits.
    let pl = p(1, 65_536, 2048);
    assert_eq!((pl.path(), pl.ctas_per_row()), (Path::Grid, 32));
    let pl = plan(&SelectSpec::new(1, 65_536, 2048, DType::BF16), false, &h200()).unwrap();
    assert_eq!(pl.path(), Path::Split);
    // Chunks of at least grid_min_chunk: 1 x 16,384 takes 8 CTAs (f32) or 4
    // (16-bit), not 132.
    let ns = |dtype| plan_with(&SelectSpec::new(1, 16_384, 64, dtype), false, &h200(), &NO_SHORT).unwrap();
    assert_eq!(ns(DType::F32).ctas_per_row(), 8);
    for dtype in [DType::BF16, DType::F16] {
        assert_eq!(ns(dtype).ctas_per_row(), 4);
    }
    assert_eq!(grid_min_chunk(DType::F32), BLOCK as u64 * GRID_ITEMS_TINY as u64);
    assert_eq!(grid_min_chunk(DType::BF16), BLOCK as u64 * GRID_ITEMS_SMALL as u64);
    // Never more CTAs than SMs in all (cooperative: all resident).
    for rows in [1usize, 2, 3, 7, 33, 66] {
        let pl = plan_with(&SelectSpec::new(rows, 16_384, 256, DType::F32), false, &h200(), &NO_SHORT).unwrap();
        assert_eq!(pl.path(), Path::Grid, "{rows} rows");
        assert!(rows as u32 * pl.ctas_per_row() <= 132);
        assert_eq!(pl.row_slots(), rows as u32);
        let g = pl.grid().unwrap().clone();
        assert_eq!(g.list % 256, 0);
        assert_eq!(g.state % 256, 0);
        assert!(g.state >= rows as u64 * (256 + GRID_SMALL) * 8);
        assert_eq!(g.state_bytes, rows as u64 * GRID_STATE_WORDS * 4);
        assert!(pl.workspace_bytes() >= g.state + g.state_bytes);
        assert_eq!(pl.smem_bytes(), (256 + GRID_SMALL as u32) * 8);
    }
    // More rows than half the SMs: one CTA per row, as before.
    let ns = plan_with(&SelectSpec::new(67, 16_384, 256, DType::F32), false, &h200(), &NO_SHORT).unwrap();
    assert_eq!(ns.path(), Path::Row);
}

#[test]
fn grid_kernel_items_follow_the_chunk() {
    let items = |rows, cols, k| p(rows, cols, k).grid().map(|g| g.items);
    // 4096: the 8-element kernels' largest chunk.
    let small = BLOCK as usize * GRID_ITEMS_SMALL as usize;
    // 1 x 262,144, k 512: f32 128 chunks of 2048 on fs_grid4_f32; bf16 64
    // chunks of 4096 on fs_grid8_*.
    assert_eq!(items(1, 262_144, 512), Some(GRID_ITEMS_TINY));
    let bf16 = plan(&SelectSpec::new(1, 262_144, 512, DType::BF16), false, &h200()).unwrap();
    assert_eq!(bf16.grid().map(|g| g.items), Some(GRID_ITEMS_SMALL));
    // 1 x 1,048,576: 132 chunks of 7,944, the 16-element kernels.
    assert_eq!(items(1, 1_048_576, 2048), Some(GRID_ITEMS));
    // At the edge: 132 chunks of exactly 4096, then one 8-element group more.
    assert_eq!(items(1, 132 * small, 512), Some(GRID_ITEMS_SMALL));
    assert_eq!(items(1, 132 * small + 1, 512), Some(GRID_ITEMS));
    assert_eq!(items(1, 132 * (small + 8), 512), Some(GRID_ITEMS));
    // Rows share the SMs: 2 x 524,288 take 66 chunks of 7,944 each, 2 x
    // 262,144 66 of 3,976.
    assert_eq!(items(2, 1 << 19, 2048), Some(GRID_ITEMS));
    assert_eq!(items(2, 1 << 18, 512), Some(GRID_ITEMS_SMALL));
    // grid8=0 keeps every grid row on the 16-element kernels.
    let wide = PathOptions { grid_small_items: false, ..PathOptions::default() };
    let pl = plan_with(&SelectSpec::new(1, 262_144, 512, DType::F32), false, &h200(), &wide).unwrap();
    assert_eq!((pl.path(), pl.ctas_per_row(), pl.grid().map(|g| g.items)), (Path::Grid, 128, Some(GRID_ITEMS)));
    // Not a grid plan: no grid layout.
    assert_eq!(items(8192, 131_072, 2048), None);
}

#[test]
fn grid_kernel_width_rules() {
    let d = PathOptions::default();
    let tiny = BLOCK as u64 * GRID_ITEMS_TINY as u64; // 2048
    let small = BLOCK as u64 * GRID_ITEMS_SMALL as u64; // 4096
    assert_eq!(grid_items(tiny, DType::F32, &d), GRID_ITEMS_TINY);
    assert_eq!(grid_items(tiny + 8, DType::F32, &d), GRID_ITEMS_SMALL);
    // A 16-bit type's 16-byte group is 8 elements: never the 4-element kernel.
    assert_eq!(grid_items(tiny, DType::BF16, &d), GRID_ITEMS_SMALL);
    assert_eq!(grid_items(8, DType::F16, &d), GRID_ITEMS_SMALL);
    assert_eq!(grid_items(small, DType::BF16, &d), GRID_ITEMS_SMALL);
    assert_eq!(grid_items(small + 8, DType::F32, &d), GRID_ITEMS);
    let wide = PathOptions { grid_small_items: false, ..d };
    assert_eq!(grid_items(tiny, DType::F32, &wide), GRID_ITEMS);
    assert_eq!(grid_kernel_name(GRID_ITEMS_TINY), "fs_grid4_f32");
    // gridchunk=2048: 1 x 262,144 bf16 takes 128 CTAs of 2048 on fs_grid8_*
    // (f32 the same CTAs on fs_grid4_f32, its default); gridchunk=4096: f32
    // takes the 64 CTAs of 4096 on fs_grid8_* that it took before v31.
    for (chunk, dtype, want) in [
        (2048, DType::F32, (128, GRID_ITEMS_TINY)),
        (2048, DType::BF16, (128, GRID_ITEMS_SMALL)),
        (4096, DType::F32, (64, GRID_ITEMS_SMALL)),
    ] {
        let o = PathOptions { grid_min_chunk: Some(chunk), ..d };
        let pl = plan_with(&SelectSpec::new(1, 262_144, 512, dtype), false, &h200(), &o).unwrap();
        assert_eq!((pl.path(), pl.ctas_per_row(), pl.grid().map(|g| g.items)), (Path::Grid, want.0, Some(want.1)));
    }
}

#[test]
fn many_rows_take_one_cta_per_row() {
    let pl = p(8192, 131_072, 2048);
    assert_eq!((pl.path(), pl.ctas_per_row(), pl.row_slots()), (Path::Row, 1, 8192));
    assert_eq!(pl.workspace_bytes(), 0);
    let pl = p(100_000, 16_384, 64);
    assert_eq!(pl.row_slots(), MAX_GRID_Y);
    // Short rows: grid x holds every row (a CTA each, or SHORT_WARPS a CTA
    // on the warp kernel).
    assert_eq!(p(100_000, 8192, 64).row_slots(), 100_000);
    assert_eq!(p(100_000, 4096, 64).row_slots(), 25_000);
    let pl = p(64, 131_072, 2048);
    assert_eq!((pl.path(), pl.ctas_per_row(), pl.merge_levels()), (Path::Split, 2, 1));
    // One wave: more rows than half the SMs take one CTA per row.
    assert_eq!(p(67, 131_072, 2048).path(), Path::Row);
    assert_eq!(p(66, 131_072, 2048).ctas_per_row(), 2);
}

#[test]
fn large_k_moves_the_buffer_to_global_memory_not_to_an_error() {
    let pl = p(4, 1 << 20, 100_000);
    assert_eq!(pl.buffer(), Buffer::Global);
    assert_eq!(pl.smem_bytes(), 0);
    assert!(pl.gbuf().is_some());
    assert_eq!(pl.stage_bytes(), 0);
    assert!(pl.workspace_bytes() >= pl.row_slots() as u64 * (pl.cap() as u64 + 1) * 8);
    // The largest shared-memory k and the first global one: 2k + tile
    // composites and the spare slot fit the opt-in limit.
    let shared_max = ((h200().max_smem_per_block - STATIC_SMEM) as usize / 8 - 1 - TILE as usize) / 2;
    assert_eq!(p(1, 1 << 20, shared_max).buffer(), Buffer::Shared);
    assert_eq!(p(1, 1 << 20, shared_max + 1).buffer(), Buffer::Global);
}

#[test]
fn workspace_holds_every_region() {
    let pl = p(3, 1_048_576, 2048);
    let sl = pl.split().cloned().expect("a split plan has split regions");
    let cand_end = sl.cand + 3 * pl.ctas_per_row() as u64 * 2048 * 8;
    assert!(sl.row_count >= cand_end && sl.row_done >= sl.row_count + 3 * 4 && sl.row_lb >= sl.row_done + 3 * 4);
    assert!(pl.workspace_bytes() >= sl.row_lb + 3 * 8);
    for off in [sl.cand, sl.row_count, sl.row_done, sl.row_lb] {
        assert_eq!(off % 256, 0);
    }
    let row = p(8192, 131_072, 2048);
    assert!(row.split().is_none() && row.gbuf().is_none() && row.grid().is_none());
}

#[test]
fn plans_are_pure_and_validate() {
    assert_eq!(p(5, 300_000, 700), p(5, 300_000, 700));
    assert!(plan(&SelectSpec::new(1, 8, 0, DType::F32), false, &h200()).is_err());
    let bf = plan(&SelectSpec::new(1, 1 << 20, 2048, DType::BF16), true, &h200()).unwrap();
    assert_eq!((bf.path(), bf.block(), TILE), (Path::Grid, BLOCK, BLOCK * 8));
}

#[test]
fn long_split_rows_are_sampled_first() {
    let pl = p(1, 4_194_304, 2048);
    assert!(pl.sampled() && pl.split().is_some());
    let pl = p(2, 1_048_576, 512);
    assert!(pl.sampled() && pl.path() == Path::Split);
    // The grid path samples nothing.
    assert!(!p(1, 1_048_576, 2048).sampled());
    // Too short for SAMPLE_MIN_TILES (4) tiles, or k too large a share of
    // the row, or one CTA per row.
    assert_eq!(SAMPLE_MIN_TILES * TILE as u64, 16_384);
    assert!(!p(1, 32_768, 512).sampled()); // one CTA: the row path (its own sample)
    assert!(!p(1, 262_144, 32_768 + 1).sampled());
    assert!(!p(8192, 131_072, 2048).sampled());
    assert!(p(1, 262_144, 8192).sampled());
}

#[test]
fn shared_buffers_take_the_room_there_is() {
    let dev = h200();
    // shared_cap is the largest buffer whose bytes fit.
    for bytes in [16u64, 17, 31, 32, 80_896, 113_664, 230_400, 230_401] {
        let cap = shared_cap(bytes);
        assert!(shared_bytes(cap, 0) <= bytes && shared_bytes(cap + 1, 0) > bytes, "{bytes} bytes");
    }
    // Row path: a buffer as big as two CTAs per SM allow beside the load
    // ring, and two still fit.
    let pl = p(8192, 131_072, 2048);
    assert_eq!((pl.buffer(), pl.stage_bytes(), pl.cap()), (Buffer::Shared, STAGE_BYTES, 10_111));
    assert_eq!(pl.smem_bytes(), (pl.cap() + 1) * 8 + STAGE_BYTES);
    assert_eq!(2 * (pl.smem_bytes() + STATIC_SMEM + 1024), dev.smem_per_sm);
    // Never below the minimum 2k + tile, even where that costs the second CTA;
    // the ring only where it fits beside the minimum.
    let pl = p(8192, 131_072, 6000);
    assert_eq!((pl.cap(), pl.stage_bytes()), (2 * 6000 + TILE, 0));
    assert_eq!(pl.smem_bytes(), (pl.cap() + 1).div_ceil(2) * 16);
    // Split path: the whole opt-in limit (one CTA per SM anyway), no ring.
    let pl = p(1, 4_194_304, 2048);
    assert_eq!(pl.stage_bytes(), 0);
    assert_eq!(pl.cap(), (dev.max_smem_per_block - STATIC_SMEM) / 8 - 1);
    assert_eq!(pl.smem_bytes() + STATIC_SMEM, dev.max_smem_per_block);
    // Global buffers stay at the minimum: they are workspace.
    let pl = p(4, 1 << 20, 100_000);
    assert_eq!((pl.buffer(), pl.cap(), pl.stage_bytes()), (Buffer::Global, 2 * 100_000 + TILE, 0));
    // A smaller device (sm_86: 100 KiB per SM, 99 KiB per block): the minimum.
    let ampere = DeviceProps::ada(84);
    let pl = plan(&SelectSpec::new(8192, 131_072, 2048, DType::F32), false, &ampere).unwrap();
    assert_eq!((pl.buffer(), pl.cap(), pl.stage_bytes()), (Buffer::Shared, 2 * 2048 + TILE, 0));
}

#[test]
fn short_rows_take_the_short_path_up_to_short_cols() {
    let dev = h200();
    // Batches (more rows than SMs) of rows of <= SHORT_COLS, k <= SHORT_MAX_K;
    // all dtypes.
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for (rows, cols, k) in [(8192, 2048, 512), (100_000, 8192, 512), (133, 8192, 1), (133, 10, 11), (200, 97, 7)] {
            let pl = plan_with(&SelectSpec::new(rows, cols, k, dtype), true, &dev, &CTA).unwrap();
            assert_eq!(pl.path(), Path::Short, "{rows} x {cols} k {k} {dtype}");
            let s = pl.short().unwrap().clone();
            assert!(s.kernel != ShortKernel::Warp, "the warp kernel off");
            assert_eq!((s.row_slots, pl.ctas_per_row(), pl.block()), (rows as u32, 1, SHORT_BLOCK));
            assert_eq!(s.sel_cap as usize, k.min(cols).next_power_of_two());
            assert_eq!(s.smem_bytes as u64, short_smem_bytes(cols as u64, s.sel_cap as u64));
            assert!(s.smem_bytes + SHORT_STATIC_SMEM <= dev.max_smem_per_block);
            assert_eq!((pl.workspace_bytes(), pl.merge_levels(), pl.sampled()), (0, 0, false));
            assert!(pl.filter().is_none() && pl.grid().is_none() && pl.split().is_none());
        }
    }
    // The boundaries: SHORT_COLS columns short, one more the row path; k up
    // to SHORT_MAX_K (the bitonic sort of k 2048 in a small CTA measured
    // slower: 8192 x 8192, 1318 against 696 us); more rows than SMs (a few
    // rows measured slower: 1 x 8192, 27.8 against 15.1 us).
    let c = SHORT_COLS as usize;
    for (rows, k) in [(8192, 512), (133, 256)] {
        assert_eq!(p(rows, c - 1, k).path(), Path::Short, "{rows} x {} k {k}", c - 1);
        assert_eq!(p(rows, c, k).path(), Path::Short, "{rows} x {c} k {k}");
        assert_eq!(p(rows, c + 1, k).path(), Path::Row, "{rows} x {} k {k}", c + 1);
        assert_eq!(p(rows, c + 8, k).path(), Path::Row, "{rows} x {} k {k}", c + 8);
    }
    assert_eq!(p(8192, 2048, SHORT_MAX_K as usize).path(), Path::Short);
    assert_eq!(p(8192, 2048, SHORT_MAX_K as usize + 1).path(), Path::Row);
    assert_eq!(p(8192, c, 2048).path(), Path::Row);
    assert_eq!(p(133, 2048, 512).short().map(|s| s.kernel), Some(ShortKernel::Cta));
    // At most one row a SM: the wide kernel (a CTA a row, the row in
    // registers), up to SHORT_WIDE_COLS.
    // Score order keeps the row or grid path.
    for rows in [1, 2, 66, 132] {
        assert_eq!(pi(rows, 2048, 512).short().map(|s| s.kernel), Some(ShortKernel::Wide), "{rows} rows");
        assert_ne!(p(rows, 2048, 512).path(), Path::Short, "{rows} rows");
    }
    assert_eq!(pi(1, 8192, 512).short().map(|s| s.kernel), Some(ShortKernel::Wide));
    // (A few rows wider than SHORT_CLUSTER_MIN_COLS: its cluster form.)
    assert_eq!(pi(1, 16_384, 512).short().map(|s| s.kernel), Some(ShortKernel::Cluster));
    assert_eq!(p(1, 16_384, 512).path(), Path::Grid);
    // k past cols: the scratch is the row's width, rounded up.
    let pl = p(400, 300, 500);
    assert_eq!((pl.path(), pl.cap()), (Path::Short, 512));
    // The short path off (the engine's switch): the row plan the geometry
    // took before it.
    let off = |rows, cols, k| plan_with(&SelectSpec::new(rows, cols, k, DType::BF16), true, &dev, &NO_SHORT).unwrap();
    let pl = off(8192, 2048, 512);
    assert_eq!((pl.path(), pl.ctas_per_row(), pl.workspace_bytes()), (Path::Row, 1, 0));
    assert_eq!(off(1, c, 512).path(), Path::Row);
    assert_eq!(off(1, 16_384, 512).path(), Path::Grid);
    // A device whose shared memory a short row does not fit (48 KiB a
    // block): the row path there, the short path for a narrower row.
    let small = DeviceProps::small_test_device();
    let on = |cols, k| plan_with(&SelectSpec::new(64, cols, k, DType::F32), true, &small, &CTA).unwrap().path();
    assert_eq!(on(8192, 512), Path::Short); // 32 KiB keys + 4 KiB selection + static < 48 KiB
    let tight = DeviceProps { max_smem_per_block: 40_960, ..small };
    assert_eq!(plan_with(&SelectSpec::new(64, 8192, 512, DType::F32), true, &tight, &CTA).unwrap().path(), Path::Row);
    assert_eq!(plan_with(&SelectSpec::new(64, 2048, 512, DType::F32), true, &tight, &CTA).unwrap().path(), Path::Short);
}

#[test]
fn short_rows_take_the_warp_kernel_within_its_bounds() {
    let dev = h200();
    let w = |rows: usize, cols: usize, k: usize, dtype: DType| {
        plan_with(&SelectSpec::new(rows, cols, k, dtype), true, &dev, &WARP_ANY_ROWS).unwrap()
    };
    // The kernel's plan: rows a warp each, SHORT_WARPS rows a CTA, the grid
    // the rows rounded up; every dtype.
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for (rows, cols, k) in [(8192, 2048, 512), (8191, 2048, 512), (133, 4096, 512), (200, 97, 7), (133, 10, 11)] {
            let pl = w(rows, cols, k, dtype);
            let s = pl.short().expect("short").clone();
            assert!(s.kernel == ShortKernel::Warp, "{rows} x {cols} k {k} {dtype}");
            assert_eq!(pl.path(), Path::Short);
            assert_eq!((s.row_slots as usize, pl.block()), (rows.div_ceil(SHORT_WARPS as usize), 32 * SHORT_WARPS));
            assert_eq!(s.sel_cap as usize, k.min(cols).next_power_of_two());
            let order = OutputOrder::Score; // SelectSpec's default
            assert_eq!(s.smem_bytes as u64, short_warp_smem_bytes(cols as u64, s.sel_cap as u64, dtype, order));
            assert!(s.smem_bytes <= dev.max_smem_per_block);
            assert_eq!((pl.workspace_bytes(), pl.ctas_per_row(), pl.cap()), (0, 1, s.sel_cap));
        }
    }
    // The slab: 256 bins, the keys (u16 for 16-bit dtypes), the selection
    // (u32 columns in index order, u64 composites in score order), each
    // rounded up to 16 bytes. The first chunk's (bf16, index order): 7 KiB a
    // warp.
    use OutputOrder::{Index, Score};
    assert_eq!(short_warp_smem_bytes(2048, 512, DType::BF16, Index), 4 * (1024 + 4096 + 2048));
    assert_eq!(short_warp_smem_bytes(2048, 512, DType::F32, Score), 4 * (1024 + 8192 + 4096));
    assert_eq!(short_warp_smem_bytes(97, 8, DType::F32, Score), 4 * (1024 + 400 + 64));
    assert_eq!(short_warp_smem_bytes(97, 8, DType::F16, Index), 4 * (1024 + 208 + 32));
    assert_eq!(short_warp_smem_bytes(1, 1, DType::BF16, Index), 4 * (1024 + 16 + 16));
    // The default rule (measured, perf-log v35): batches of at least
    // SHORT_WARP_MIN_ROWS rows of at most SHORT_WARP_COLS columns. The QSA
    // first chunk (8192 x 2048 blocks, k 512, index order) takes it.
    let qsa = SelectSpec::new(8192, 2048, 512, DType::BF16).with_order(Index);
    let pl = plan(&qsa, true, &dev).unwrap();
    assert!(pl.short().unwrap().kernel == ShortKernel::Warp);
    assert_eq!((pl.smem_bytes(), pl.row_slots(), pl.block()), (4 * 7168, 2048, 128));
    let d =
        |rows: usize, cols: usize, k: usize| plan(&SelectSpec::new(rows, cols, k, DType::BF16), true, &dev).unwrap();
    let (c, r) = (SHORT_WARP_COLS as usize, SHORT_WARP_MIN_ROWS as usize);
    for k in [512, 64, 1] {
        // Columns: c a warp, c + 1 a CTA (1024 x 8192 measured slower on the
        // warp kernel: 150.8 against 84.4 us), SHORT_COLS + 1 the row path.
        assert!(d(8192, c, k).short().unwrap().kernel == ShortKernel::Warp, "8192 x {c} k {k}");
        assert!(d(8192, c - 1, k).short().unwrap().kernel == ShortKernel::Warp, "8192 x {} k {k}", c - 1);
        let pl = d(8192, c + 1, k);
        assert!(pl.short().unwrap().kernel != ShortKernel::Warp, "8192 x {} k {k}", c + 1);
        assert_eq!((pl.row_slots(), pl.block()), (8192, SHORT_BLOCK));
        assert_eq!(d(8192, SHORT_COLS as usize + 1, k).path(), Path::Row);
        // Rows: r a warp each, r - 1 a CTA each (528 x 2048 measured slower
        // on the warp kernel: 13.3 against 10.4 us index, 23.9 against 20.5
        // score).
        assert!(d(r, 2048, k).short().unwrap().kernel == ShortKernel::Warp, "{r} x 2048 k {k}");
        assert!(d(r - 1, 2048, k).short().unwrap().kernel != ShortKernel::Warp, "{} x 2048 k {k}", r - 1);
        assert!(d(528, 2048, k).short().unwrap().kernel != ShortKernel::Warp);
        assert!(d(133, 2048, k).short().unwrap().kernel != ShortKernel::Warp);
    }
    assert!(d(1024, 8192, 512).short().unwrap().kernel != ShortKernel::Warp);
    // The short path's own bounds hold first: k past SHORT_MAX_K, the row path.
    assert_eq!(d(8192, 2048, SHORT_MAX_K as usize + 1).path(), Path::Row);
    assert!(d(8192, 2048, SHORT_MAX_K as usize).short().unwrap().kernel == ShortKernel::Warp);
    // The switches: the warp kernel off (CTA), the short path off.
    assert!(plan_with(&qsa, true, &dev, &CTA).unwrap().short().unwrap().kernel != ShortKernel::Warp);
    assert_eq!(plan_with(&qsa, true, &dev, &NO_SHORT).unwrap().path(), Path::Row);
    // Any batch the short path takes (the check's parity run), and a wider
    // column bound (the dev tool's A/B at SHORT_COLS): the warp kernel where
    // the CTA's four slabs fit the device's shared memory.
    assert!(w(133, 2048, 512, DType::F32).short().unwrap().kernel == ShortKernel::Warp);
    let wide = PathOptions { short_warp_cols: SHORT_COLS, ..WARP_ANY_ROWS };
    let pl = plan_with(&SelectSpec::new(1024, 8192, 512, DType::F32), true, &dev, &wide).unwrap();
    assert!(pl.short().unwrap().kernel == ShortKernel::Warp);
    assert_eq!(pl.smem_bytes() as u64, short_warp_smem_bytes(8192, 512, DType::F32, Score));
    // Where four slabs do not fit (48 KiB a block): the CTA kernel.
    let small = DeviceProps::small_test_device();
    let on = |cols| plan_with(&SelectSpec::new(64, cols, 512, DType::F32), true, &small, &WARP_ANY_ROWS).unwrap();
    assert!(on(4096).short().unwrap().kernel != ShortKernel::Warp); // 4 x (1 + 16 + 4) KiB > 48 KiB
    assert!(on(1024).short().unwrap().kernel == ShortKernel::Warp); // 4 x (1 + 4 + 4) KiB
}

/// The wide kernel's bounds: index order, at most one row a SM, rows of at most
/// SHORT_WIDE_COLS columns, k at most SHORT_WIDE_MAX_K (each side of every
/// bound), every dtype; past them the row, grid or split plan the
/// geometry takes with the wide kernel off, which `short_wide_cols: 0`
/// gives everywhere.
#[test]
fn few_rows_take_the_wide_kernel_within_its_bounds() {
    let dev = h200();
    // The wide kernel itself (its cluster form: the next test).
    let plain = PathOptions { short_cluster: false, ..PathOptions::default() };
    let no_wide = PathOptions { short_wide_cols: 0, ..plain };
    let c = SHORT_WIDE_COLS as usize;
    let kmax = SHORT_WIDE_MAX_K as usize;
    assert_eq!(c, (SHORT_WIDE_BLOCK * SHORT_WIDE_ITEMS) as usize);
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let pl = |rows: usize, cols: usize, k: usize, opts: &PathOptions| {
            let spec = SelectSpec::new(rows, cols, k, dtype).with_order(OutputOrder::Index);
            plan_with(&spec, true, &dev, opts).unwrap()
        };
        // Score order: the plan of the wide kernel off.
        let score = |rows, cols, k, opts: &PathOptions| {
            plan_with(&SelectSpec::new(rows, cols, k, dtype), true, &dev, opts).unwrap()
        };
        assert_eq!(score(1, c, 512, &plain), score(1, c, 512, &no_wide));
        assert_eq!(score(7, 3000, 512, &plain), score(7, 3000, 512, &no_wide));
        let wide = |rows, cols, k| pl(rows, cols, k, &plain).short().map(|s| s.kernel);
        for (rows, cols, k) in [(1, 1, 1), (1, 16, 512), (1, c, 512), (1, c, kmax), (132, c, 2048), (7, 3000, 3000)] {
            let p = pl(rows, cols, k, &plain);
            let s = p.short().expect("short");
            assert_eq!(s.kernel, ShortKernel::Wide, "{rows} x {cols} k {k} {dtype}");
            assert_eq!((p.block(), s.row_slots, p.workspace_bytes()), (SHORT_WIDE_BLOCK, rows as u32, 0));
            // The selection's scratch: min(k, cols) rounded up to a power of two.
            let cap = k.min(cols).next_power_of_two();
            assert_eq!((s.sel_cap as usize, s.smem_bytes as usize), (cap, cap * 8));
            assert_ne!(pl(rows, cols, k, &no_wide).short().map(|s| s.kernel), Some(ShortKernel::Wide));
        }
        // One column, one k, one row past each bound.
        assert_ne!(wide(1, c + 1, 512), Some(ShortKernel::Wide), "{dtype}");
        assert_ne!(wide(1, c, kmax + 1), Some(ShortKernel::Wide), "{dtype}");
        assert_ne!(wide(133, 2048, 512), Some(ShortKernel::Wide), "{dtype}");
        assert_eq!(wide(133, 2048, 512), Some(ShortKernel::Cta), "{dtype}");
        assert_eq!(pl(1, c + 1, 512, &plain).path(), Path::Grid, "{dtype}");
        // A narrower bound from the engine's switch.
        let narrow = PathOptions { short_wide_cols: 4096, ..plain };
        assert_eq!(pl(1, 4096, 512, &narrow).short().map(|s| s.kernel), Some(ShortKernel::Wide));
        assert_ne!(pl(1, 4097, 512, &narrow).short().map(|s| s.kernel), Some(ShortKernel::Wide));
    }
}

#[test]
fn the_widest_few_wide_rows_take_clusters() {
    // The wide kernel's batches of at most SHORT_CLUSTER_MAX_ROWS rows wider
    // than SHORT_CLUSTER_MIN_COLS take its cluster form: SHORT_CLUSTER_CTAS
    // CTAs a row; one past each bound, the switch off, or too few SMs for
    // the clusters: the wide kernel.
    let dev = h200();
    let c = SHORT_WIDE_COLS as usize;
    let min = SHORT_CLUSTER_MIN_COLS as usize;
    let rmax = SHORT_CLUSTER_MAX_ROWS as usize;
    let off = PathOptions { short_cluster: false, ..PathOptions::default() };
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let pl = |rows: usize, cols: usize, k: usize, opts: &PathOptions, dev: &DeviceProps| {
            let spec = SelectSpec::new(rows, cols, k, dtype).with_order(OutputOrder::Index);
            plan_with(&spec, true, dev, opts).unwrap()
        };
        let kernel = |p: &Plan| p.short().map(|s| s.kernel);
        for (rows, cols, k) in [(1, min + 1, 512), (1, c, 512), (1, c, SHORT_WIDE_MAX_K as usize), (rmax, c, 2048)] {
            let p = pl(rows, cols, k, &PathOptions::default(), &dev);
            let s = p.short().expect("short");
            assert_eq!(s.kernel, ShortKernel::Cluster, "{rows} x {cols} k {k} {dtype}");
            assert_eq!((p.block(), s.row_slots), (SHORT_WIDE_BLOCK, rows as u32 * SHORT_CLUSTER_CTAS), "{dtype}");
            let cap = k.min(cols).next_power_of_two();
            assert_eq!((s.sel_cap as usize, s.smem_bytes as usize, p.workspace_bytes()), (cap, cap * 8, 0));
            assert_eq!(kernel(&pl(rows, cols, k, &off, &dev)), Some(ShortKernel::Wide), "{dtype}");
        }
        assert_eq!(kernel(&pl(1, min, 512, &PathOptions::default(), &dev)), Some(ShortKernel::Wide));
        assert_eq!(kernel(&pl(rmax + 1, c, 512, &PathOptions::default(), &dev)), Some(ShortKernel::Wide));
        assert_ne!(kernel(&pl(1, c + 1, 512, &PathOptions::default(), &dev)), Some(ShortKernel::Cluster));
        // Score order never takes the wide kernel nor its clusters.
        let score = plan_with(&SelectSpec::new(1, c, 512, dtype), true, &dev, &PathOptions::default()).unwrap();
        assert_eq!(score, plan_with(&SelectSpec::new(1, c, 512, dtype), true, &dev, &off).unwrap());
        // A device with fewer SMs than a batch's clusters need.
        let small = DeviceProps::hopper(7);
        assert_eq!(kernel(&pl(2, c, 512, &PathOptions::default(), &small)), Some(ShortKernel::Wide));
        assert_eq!(kernel(&pl(1, c, 512, &PathOptions::default(), &small)), Some(ShortKernel::Cluster));
    }
}
