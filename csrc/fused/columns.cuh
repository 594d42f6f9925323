// Launch layout of the bias + activation kernels: a thread owns one 16-byte column vector (or
// one column on the scalar path) of a [rows, cols] tensor and walks down the rows, so it loads
// its bias once and sums its bias gradient in registers without any index arithmetic per
// element. Block: tx column vectors x ty row lanes; grid: enough column blocks to cover the
// row, and enough row blocks to fill the GPU. Each (row block, row lane) is a slot that writes
// one row of fp32 partial bias-gradient sums (column_sums adds them).
#pragma once
#include <initializer_list>

#include "common.cuh"

namespace megatron_fused {

constexpr int kColumnThreads = 256;

struct ColumnPlan {
  int tx, ty;
  unsigned gx, gy;
  int64_t slots() const { return static_cast<int64_t>(gy) * ty; }
};

// rows >= 1, vcols >= 1 (column vectors per row)
inline ColumnPlan column_plan(int64_t rows, int vcols) {
  ColumnPlan plan{};
  plan.tx = static_cast<int>(ceil_div(vcols, 32) * 32);
  if (plan.tx > kColumnThreads) plan.tx = kColumnThreads;
  plan.ty = kColumnThreads / plan.tx;
  plan.gx = static_cast<unsigned>(ceil_div(vcols, plan.tx));
  const int64_t blocks = static_cast<int64_t>(sm_count()) * (2048 / kColumnThreads);  // one full wave
  int64_t gy = ceil_div(blocks, plan.gx);
  const int64_t most = ceil_div(rows, plan.ty);
  if (gy > most) gy = most;
  if (gy > 65535) gy = 65535;
  plan.gy = static_cast<unsigned>(gy < 1 ? 1 : gy);
  return plan;
}

// Floats of partial sums for `plan_cols` columns planned and `part_cols` summed per slot: the
// larger of the vector and the scalar plan's slot count (either may run).
inline int64_t column_workspace(int64_t rows, int plan_cols, int part_cols, int vec) {
  if (rows <= 0 || plan_cols <= 0) return 0;
  int64_t slots = column_plan(rows, plan_cols).slots();
  if (plan_cols % vec == 0) {
    const int64_t v = column_plan(rows, plan_cols / vec).slots();
    if (v > slots) slots = v;
  }
  return slots * part_cols;
}

// Vector width of the fast path for T, or 1 where a pointer or the row length does not allow it.
template <typename T>
inline bool vector_ok(int64_t cols, std::initializer_list<const void*> pointers) {
  if (cols % (16 / sizeof(T)) != 0) return false;
  for (const void* p : pointers) {
    if (p != nullptr && !aligned16(p)) return false;
  }
  return true;
}

}  // namespace megatron_fused
