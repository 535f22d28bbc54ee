#include "cuda/comm/peer_exchange.h"

#include <algorithm>

#include "core/error.h"
#include "cuda/common/check.h"

namespace dsv4::cuda {

namespace {

int attribute(cudaDeviceAttr what, int device) {
  int v = -1;
  if (cudaDeviceGetAttribute(&v, what, device) != cudaSuccess) (void)cudaGetLastError();
  return v;
}

}  // namespace

bool PeerExchange::possible(const std::vector<int>& devices) {
  for (int a : devices)
    for (int b : devices) {
      if (a == b) continue;
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can) {
        (void)cudaGetLastError();
        return false;
      }
      for (cudaDeviceAttr cc : {cudaDevAttrComputeCapabilityMajor, cudaDevAttrComputeCapabilityMinor})
        if (attribute(cc, a) != attribute(cc, b)) return false;
    }
  return true;
}

PeerExchange::PeerExchange(const std::vector<int>& devices) {
  const int n = int(devices.size());
  DSV4_CHECK(n >= 2 && n <= kPeerMaxRanks, "peer exchange: ", n, " ranks (2 to ", kPeerMaxRanks, ")");
  DSV4_CHECK(possible(devices),
             "peer exchange: a pair of GPUs cannot reach each other's memory, or differ in architecture");
  for (int a : devices)
    for (int b : devices) {
      if (a == b) continue;
      DSV4_CUDA_CHECK(cudaSetDevice(a));
      const cudaError_t err = cudaDeviceEnablePeerAccess(b, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
      else DSV4_CUDA_CHECK(err);
    }
  const size_t words = size_t(peer_inbox_word(2, 0, n, 0, 0, 0));  // the inbox's 16-byte words
  for (int d : devices) {
    const int sms = attribute(cudaDevAttrMultiProcessorCount, d);
    DSV4_CHECK(sms > 0, "peer exchange: GPU ", d, "'s SM count is unknown");
    sms_ = sms_ == 0 ? sms : std::min(sms_, sms);
    DSV4_CUDA_CHECK(cudaSetDevice(d));
    RankMemory m;
    m.device = d;
    memory_.push_back(m);  // freed by the destructor from here on
    RankMemory& k = memory_.back();
    DSV4_CUDA_CHECK(cudaMalloc(&k.inbox, words * sizeof(uint4)));
    DSV4_CUDA_CHECK(cudaMalloc(&k.calls, kPeerSlots * sizeof(unsigned)));
    DSV4_CUDA_CHECK(cudaMemset(k.inbox, 0, words * sizeof(uint4)));  // flag 0: no call yet (the first is 1)
    DSV4_CUDA_CHECK(cudaMemset(k.calls, 0, kPeerSlots * sizeof(unsigned)));
  }
  DSV4_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&aborted_), sizeof(unsigned),
                                cudaHostAllocMapped | cudaHostAllocPortable));
  *aborted_ = 0;
  for (int d : devices) {
    DSV4_CUDA_CHECK(cudaSetDevice(d));
    DSV4_CUDA_CHECK(cudaDeviceSynchronize());  // every rank's zeroed counts are in place before any call
  }
}

PeerExchange::~PeerExchange() {
  quiesce();
  for (const RankMemory& m : memory_) {
    cudaSetDevice(m.device);
    cudaFree(m.inbox);
    cudaFree(m.calls);
  }
  if (aborted_) cudaFreeHost(aborted_);
}

PeerSlots PeerExchange::slots(int rank) const {
  DSV4_ASSERT(rank >= 0 && rank < ranks());
  PeerSlots p;
  for (int q = 0; q < ranks(); ++q) p.inbox[q] = memory_[size_t(q)].inbox;
  p.calls = memory_[size_t(rank)].calls;
  p.aborted = aborted_;  // mapped and portable: the same address on every device (unified addressing)
  p.rank = rank;
  p.ranks = ranks();
  return p;
}

void PeerExchange::abort() { *reinterpret_cast<volatile unsigned*>(aborted_) = 1; }

void PeerExchange::quiesce() const {
  for (const RankMemory& m : memory_)
    if (cudaSetDevice(m.device) == cudaSuccess) cudaDeviceSynchronize();
  (void)cudaGetLastError();
}

}  // namespace dsv4::cuda
