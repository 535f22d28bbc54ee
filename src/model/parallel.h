// How the model splits over ranks (GPUs of one host, or in-process CPU ranks): each rank holds a shard of the
// weights — views into the checkpoint, never copies — and runs the same forward pass on it; two all-reduces a
// layer (after the attention's output projection and after the MoE) sum the partial outputs.
//
//   tensor parallel (tp = ranks): each rank owns H/tp query heads — its rows of wq_b, its output groups of
//     wo_a (G/tp) and the matching columns of wo_b, its attention sinks. The single K = V head, wq_a, wkv,
//     the compressors and the indexer are replicated (one shared head cannot split), as are the mHC mixes,
//     norms, the router and the embedding.
//   the LM head: by vocabulary rows, ⌈V/ranks⌉ a rank, under either split; each rank scores its tokens and the
//     host takes the best (DeepseekV4::deliver).
//   routed experts: whole experts, E/ep per rank, when ep = ranks (expert parallel); otherwise every expert's
//     intermediate dimension is split over tp ranks (w1 and w3 rows, w2 columns: balanced at batch 1).
//   the shared expert: split like the routed experts under tensor parallelism; whole on rank 0 under expert
//     parallelism (the other ranks have none), so that the sum over ranks counts it once.
//
// ranks = max(tp, ep), and each of tp and ep is 1 or ranks: `--tp 2` splits attention and experts by
// dimension, `--ep 2` keeps attention whole on every rank and splits the experts, `--tp 2 --ep 2` splits
// attention by heads and experts whole.
#pragma once

#include <memory>
#include <string>

#include "model/ops.h"
#include "model/weights.h"

namespace dsv4 {

struct Parallelism {
  int tp = 1;
  int ep = 1;
  int ranks() const { return tp > ep ? tp : ep; }
  bool experts_whole() const { return ep > 1; }
};

// Throws a clear Error when the model cannot split so: tp or ep not in {1, ranks}, heads, output groups, experts
// or the intermediate dimension not divisible, or a slice that would cut a weight's scale block.
void check_parallelism(const ModelWeights& model, const Parallelism& p);

// Rank r's shard: the same ModelWeights layout, config with the rank's local sizes (n_heads, o_groups,
// moe_inter_dim), matrices as views of `model`'s storage; experts the rank does not own are empty. The full
// model must outlive the shard.
std::unique_ptr<ModelWeights> shard_model(const ModelWeights& model, const Parallelism& p, int rank);

// One rank: its shard of the weights and the backend that runs it.
struct Shard {
  const ModelWeights* model = nullptr;
  Ops* ops = nullptr;
};

std::string parallelism_name(const Parallelism& p);  // "tp 2", "ep 2", "tp 2 · ep 2", "1 rank"

}  // namespace dsv4
