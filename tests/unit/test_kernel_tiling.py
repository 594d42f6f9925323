"""The index arithmetic of the fast kernels, written out in Python and checked on CPU: every
element is read and written exactly once per pass, every partial-sum slot is written (the
workspace is not zeroed), vector accesses stay inside the row. A transcription of the loops in
csrc/fused (norm_fast.cu, softmax_fast.cu, bias_gelu.cu, swiglu.cu, columns.cuh, rope.cu):
the GPU tests check the kernels themselves at shapes chosen to reach these same paths.
"""
import collections

import pytest


def ceil_div(a, b):
    return -(-a // b)


def row_tile(cols, elems, vec, target=512):
    """(threads per row, rows per block, {column: visits}) of norm_fast / softmax_fast's RowTile."""
    tpr = ceil_div(ceil_div(cols, elems), 32) * 32
    rpb = 1 if tpr >= target else target // tpr
    seen = collections.Counter()
    for p in range(elems // vec):
        for tx in range(tpr):
            c = (p * tpr + tx) * vec
            if c < cols:  # a vector starting inside the row lies inside it: cols % vec == 0 on this path
                assert c + vec <= cols
                seen.update(range(c, c + vec))
    return tpr, rpb, seen


@pytest.mark.parametrize("elems, max_cols", [(8, 8192), (16, 16384)])  # norms, softmax
@pytest.mark.parametrize("vec", [8, 4])  # bf16 / fp16, fp32
def test_row_tiles_cover_each_column_once(elems, max_cols, vec):
    for cols in sorted({vec, 8 * vec, 1000 // vec * vec, 4096, 5120, max_cols - vec, max_cols}):
        tpr, rpb, seen = row_tile(cols, elems, vec)
        assert seen == collections.Counter(range(cols)), cols
        assert tpr * rpb <= 1024 and tpr * rpb // 32 <= 32, "block size / row_reduce scratch"


def persistent_rows(rows, rpb, blocks):
    """{row: visits} and the slots of norm_fast / softmax_fast's persistent loop."""
    seen, slots = collections.Counter(), set()
    step = blocks * rpb
    for bx in range(blocks):
        for ty in range(rpb):
            slots.add(bx * rpb + ty)  # every slot writes its partial row, visited rows or not
            base = bx * rpb
            while base < rows:
                if base + ty < rows:
                    seen[base + ty] += 1
                base += step
    return seen, slots


@pytest.mark.parametrize("rows, rpb, blocks", [(1, 1, 1), (7, 4, 2), (4096, 2, 264), (1000, 16, 3), (5, 8, 1)])
def test_persistent_rows_once_and_every_slot(rows, rpb, blocks):
    blocks = min(blocks, ceil_div(rows, rpb))  # the plans' min(wanted, resident)
    seen, slots = persistent_rows(rows, rpb, blocks)
    assert seen == collections.Counter(range(rows)) and slots == set(range(blocks * rpb))


def column_plan(rows, vcols, sms=132):
    tx = min(ceil_div(vcols, 32) * 32, 256)
    ty = 256 // tx
    gx = ceil_div(vcols, tx)
    gy = max(1, min(ceil_div(sms * 8, gx), ceil_div(rows, ty), 65535))
    return tx, ty, gx, gy


def column_rows(rows, ty_lane, gy_block, ty, gy, unroll):
    """Rows a thread of bias_gelu.cu visits: an unrolled loop, then the tail."""
    step, r, out = gy * ty, gy_block * ty + ty_lane, []
    while r + (unroll - 1) * step < rows:
        out += [r + u * step for u in range(unroll)]
        r += unroll * step
    while r < rows:
        out.append(r)
        r += step
    return out


@pytest.mark.parametrize("rows, cols, vec", [(1, 8, 8), (3, 4104, 8), (301, 520, 8), (1000, 13, 1), (257, 24, 4),
                                             (9, 2002, 1)])
@pytest.mark.parametrize("unroll", [4, 2])  # bias-GeLU forward, backward
def test_column_layout_visits_each_element_once(rows, cols, vec, unroll):
    tx, ty, gx, gy = column_plan(rows, cols // vec, sms=2)  # few SMs: many rows per thread
    seen = collections.Counter()
    for bx in range(gx):
        for lane in range(tx):
            c = (bx * tx + lane) * vec
            if c >= cols:
                continue
            for by in range(gy):
                for t in range(ty):
                    seen.update((r, c + i) for r in column_rows(rows, t, by, ty, gy, unroll) for i in range(vec))
    assert seen == collections.Counter((r, c) for r in range(rows) for c in range(cols))


def test_the_workspace_fits_either_plan():
    def workspace(rows, plan_cols, part_cols, vec):  # columns.cuh column_workspace
        slots = [column_plan(rows, plan_cols)[1] * column_plan(rows, plan_cols)[3]]
        if plan_cols % vec == 0:
            slots.append(column_plan(rows, plan_cols // vec)[1] * column_plan(rows, plan_cols // vec)[3])
        return max(slots) * part_cols
    for rows in (1, 7, 100, 5000):
        for cols in (8, 64, 1000, 16384):
            for vec in (8, 4):
                need = [column_plan(rows, v)[1] * column_plan(rows, v)[3] * cols
                        for v in ([cols, cols // vec] if cols % vec == 0 else [cols])]
                assert workspace(rows, cols, cols, vec) >= max(need)


@pytest.mark.parametrize("dim, vec", [(2, 1), (8, 1), (64, 8), (128, 8), (128, 4), (600, 1)])
def test_rope_threads_cover_both_halves_once(dim, vec):
    half = dim // 2
    per_row = half // vec
    tx = min(per_row, 256)
    seen = collections.Counter()
    for lane in range(tx):
        j = lane * vec
        while j < half:
            seen.update(range(j, j + vec))
            seen.update(range(half + j, half + j + vec))
            j += tx * vec
    assert seen == collections.Counter(range(dim))
