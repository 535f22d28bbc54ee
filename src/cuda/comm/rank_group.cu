#include "cuda/comm/rank_group.h"

#include "core/error.h"

namespace dsv4::cuda {

RankGroup::RankGroup(const std::vector<int>& devices) : nccl_(devices) {
  try {
    peer_ = std::make_unique<PeerAllReduce>(devices);
  } catch (const Error&) {
    peer_.reset();  // no peer access between some pair: NCCL carries every message
  }
}

void RankGroup::all_reduce(int rank, float* x, size_t count, cudaStream_t stream) {
  DSV4_CHECK(!aborted_, "another rank of this model failed; the model cannot run further");
  if (peer_ && PeerAllReduce::fits(count)) peer_->all_reduce(rank, x, count, stream);
  else nccl_.all_reduce(rank, x, count, stream);
}

void RankGroup::abort() {
  aborted_ = true;
  if (peer_) peer_->abort();
  nccl_.abort();
}

}  // namespace dsv4::cuda
