//! The tile shapes, and what every tile driver shares: the row blocks it
//! reads ([`Rows`]), the aligned buffer a GEMM tile is written into
//! (`TileBuffer`), and the scratch memory one worker thread needs for it
//! ([`tile_workspace_bytes`]).
//!
//! Pass-2 tiles are `TILE_ROWS × TILE_COLS` ([`super::search`]), pass-1 tiles
//! `BANK_TILE_ROWS × BANK_TILE_COLS` ([`super::column_stats`]); the Sinkhorn
//! sweeps ([`super::sinkhorn`]) use the pass-2 shape.

/// Rows of one similarity tile (queries or bank rows).
///
/// Measured with `examples/gemm_shapes.rs` (d = 512, 2048 × 8192, two threads,
/// one strip of tiles per task; this shared machine varies by ±30% between
/// runs): 512 × 1024 tiles 124–168 GFLOP/s, 1024 × 1024 138–200, 512 × 2048
/// 153–174, one large GEMM parallelised inside `gemm` 110–126. On one thread,
/// 256-row tiles were up to 40% slower than 512-row ones. 512 rows keep two
/// strips busy for query blocks of a few hundred rows.
pub const TILE_ROWS: usize = 512;

/// Column folds (log-sum-exp over rows) take the rows of a tile in groups of
/// this many: each group's column maxima shift its exps, which are summed in
/// f32 over the group (each ≤ 1) before joining the f64 sums. Tiles and bank
/// blocks start at multiples of it, so the groups are the same global rows
/// however the matrix is cut, and results do not depend on block sizes.
pub const GROUP_ROWS: usize = 128;
const _: () = assert!(
    TILE_ROWS.is_multiple_of(GROUP_ROWS) && BANK_TILE_ROWS.is_multiple_of(GROUP_ROWS),
    "tiles start on group boundaries"
);

/// Columns of one similarity tile (gallery items). A 512 × 2048 f32 tile is 4 MiB.
pub const TILE_COLS: usize = 2048;

/// Rows (bank items) of one pass-1 tile. Pass 1 has many more rows than a
/// query block, so its tiles are tall and narrow: the `gemm` crate packs the
/// gallery side of every tile it is given (the bank side is read in place), so
/// the packing costs 1/(2·rows) of the tile's work. Measured on the Xeon of
/// `benches/runs/2026-11-25-xeon` (100k gallery × 30k bank, d = 384, one
/// thread, `perf`): packing took 5.7% of the pass at 512 × 2048 tiles and
/// 2.2% at 2048 × 512 (2.4% at 2048 × 1024). With the strips of
/// [`super::column_stats`] and the banks read beside the first gallery chunk,
/// 100k × 100k went from 46.6 to 44.3 s on one thread and from 23.7 to 22.1 s
/// on two (medians of 3, alternating, same bits).
pub const BANK_TILE_ROWS: usize = 2048;

/// Columns (gallery items) of one pass-1 tile: the width of one strip, one
/// task. A 2048 × 512 f32 tile is 4 MiB, as in pass 2. Narrow strips also
/// make many tasks, so two threads end together (see `strip_bounds` in
/// [`super::column_stats`]).
pub const BANK_TILE_COLS: usize = 512;

/// Rows of the pieces the AVX-512 slab kernel (`gemm::SlabTiles`) computes
/// at a time, which the epilogues read back while they are in L2: whole
/// groups of the pass-1 fold.
pub const SLAB_ROWS: usize = GROUP_ROWS;

/// Columns of those pieces in pass 2 (in pass 1, a strip's): a 128 × 512 f32
/// piece is 256 KiB, and the packed columns, 512 × d floats, stay in L2
/// while every row block passes them.
pub const SLAB_COLS: usize = BANK_TILE_COLS;

/// Lanes processed together by the epilogues (one AVX-512 register of f32).
pub(super) const LANES: usize = 16;

/// Per-thread cache buffer the `gemm` crate keeps for packing (its L2 slab,
/// the size of the L2 cache: 1 MiB here); 2 MiB covers common CPUs.
const GEMM_THREAD_SLAB_BYTES: usize = 2 << 20;
/// Upper bound of the depth `gemm` packs at once (measured: 384 at d = 768).
const GEMM_MAX_DEPTH: usize = 512;

const fn min(a: usize, b: usize) -> usize {
    if a < b {
        a
    } else {
        b
    }
}

const fn max(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

/// Scratch memory one worker thread needs at dimension `dim`: the tile, the
/// per-strip state copies, and the GEMM's buffers (the packed operands,
/// `(TILE_ROWS + TILE_COLS) × kc` floats with a depth kc that `gemm` caps
/// below 512, and its per-thread slab). The crate allocates its packed
/// operands per call and keeps only the slab; a tile is computed either by
/// the crate or by the slab kernel (`gemm::SlabTiles`), whose packed
/// columns take the packed operands' place (beside them only the small
/// shapes' chains run, which pack nothing), so the larger of the two is
/// counted.
/// The memory plan counts this once per thread; `tests/memory.rs` checks
/// that the crate's allocations and the slab kernel's are no more.
pub const fn tile_workspace_bytes(dim: usize) -> usize {
    let search = shape_workspace_bytes(TILE_ROWS, TILE_COLS, dim);
    let bank = shape_workspace_bytes(BANK_TILE_ROWS, BANK_TILE_COLS, dim);
    max(search, bank)
}

/// [`tile_workspace_bytes`] for tiles of `rows × cols`.
const fn shape_workspace_bytes(rows: usize, cols: usize, dim: usize) -> usize {
    let f32_bytes = std::mem::size_of::<f32>();
    // The tile with its row padding and alignment (`TileBuffer`).
    (rows + 1) * (cols + 2 * LINE_CELLS) * f32_bytes
        + cols * 64
        + packing_bytes(rows, cols, dim)
        + GEMM_THREAD_SLAB_BYTES
}

/// The room [`shape_workspace_bytes`] counts for packed operands: the
/// crate's, or the slab kernel's packed columns (at most [`SLAB_COLS`]).
const fn packing_bytes(rows: usize, cols: usize, dim: usize) -> usize {
    let f32_bytes = std::mem::size_of::<f32>();
    let packed_operands = (rows + cols) * min(dim, GEMM_MAX_DEPTH) * f32_bytes;
    let packed_columns = (SLAB_COLS + LINE_CELLS) * dim * f32_bytes;
    max(packed_operands, packed_columns)
}

/// What a Sinkhorn sweep's thread needs beyond [`tile_workspace_bytes`]:
/// there the slab kernel packs a whole strip of [`TILE_COLS`] columns once
/// for all the rows that pass it, more than the room counted for packed
/// operands above d ≈ 635 (nothing below).
pub const fn sweep_packing_bytes(dim: usize) -> usize {
    let strip = (TILE_COLS + LINE_CELLS) * dim * std::mem::size_of::<f32>();
    strip.saturating_sub(packing_bytes(TILE_ROWS, TILE_COLS, dim))
}

/// A borrowed row-major block of embeddings.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub dim: usize,
}

impl<'a> Rows<'a> {
    pub fn new(data: &'a [f32], dim: usize) -> Self {
        let rows = data.len().checked_div(dim).unwrap_or(0);
        Rows { data, rows, dim }
    }

    pub(super) fn slice(&self, start: usize, end: usize) -> Rows<'a> {
        Rows {
            data: &self.data[start * self.dim..end * self.dim],
            rows: end - start,
            dim: self.dim,
        }
    }
}

/// A similarity tile: rows of `cols` cells, `stride` apart and
/// starting on 64-byte boundaries. The stride is the width rounded up to
/// whole cache lines, plus one line: with a power-of-two stride (2048 floats = 8 KiB)
/// every row of a column block falls into the same few L1 sets, so the
/// GEMM's stores and the fold's column reads would evict each other.
pub(super) struct TileBuffer {
    data: Vec<f32>,
    offset: usize,
    pub(super) stride: usize,
}

/// f32 cells per 64-byte cache line.
const LINE_CELLS: usize = 16;

impl TileBuffer {
    pub(super) fn new(rows: usize, cols: usize) -> Self {
        let stride = cols.next_multiple_of(LINE_CELLS) + LINE_CELLS;
        let data = vec![0f32; rows * stride + LINE_CELLS];
        let offset = data.as_ptr().align_offset(64).min(LINE_CELLS);
        TileBuffer {
            data,
            offset,
            stride,
        }
    }

    pub(super) fn cells_mut(&mut self) -> &mut [f32] {
        &mut self.data[self.offset..]
    }
}
