// libdsv4_trace.so: the kernels a CUDA program ran, as they ran — start and end of each on the GPU clock,
// kernels not serialised (unlike Nsight Compute, which replays each kernel alone and so hides programmatic
// dependent launch and every overlap). A CUDA injection library: the driver loads it at initialisation when
//   CUDA_INJECTION64_PATH=/path/libdsv4_trace.so DSV4_TRACE=/path/trace.csv <program>
// and it records CUPTI's concurrent-kernel activity, written at exit as CSV rows
//   start_ns,end_ns,stream,grid_blocks,block_threads,name
// in start order. tools/gpu-timeline reads it. Needs libcupti (CUDA toolkit) beside the program.
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct KernelRecord {
  uint64_t start, end;
  uint32_t stream;
  int64_t blocks;
  int32_t threads;
  std::string name;
};

std::mutex g_mutex;
std::vector<KernelRecord> g_records;
size_t g_dropped = 0;

void check(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return;
  const char* message = nullptr;
  cuptiGetResultString(result, &message);
  std::fprintf(stderr, "dsv4_trace: %s failed: %s\n", what, message ? message : "unknown CUPTI error");
  std::exit(1);
}

std::string demangle(const char* name) {
  if (!name) return "?";
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && plain ? plain : name;
  std::free(plain);
  return out;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kBytes = 8 << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBytes));
  *size = *buffer ? kBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    g_records.push_back({k->start, k->end, k->streamId, int64_t(k->gridX) * k->gridY * k->gridZ,
                         k->blockX * k->blockY * k->blockZ, demangle(k->name)});
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS) g_dropped += dropped;
  std::free(buffer);
}

void write_trace() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char* path = std::getenv("DSV4_TRACE");
  std::lock_guard<std::mutex> lock(g_mutex);
  std::FILE* out = path ? std::fopen(path, "w") : stderr;
  if (!out) {
    std::fprintf(stderr, "dsv4_trace: cannot write %s\n", path);
    return;
  }
  std::sort(g_records.begin(), g_records.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
  std::fprintf(out, "start_ns,end_ns,stream,grid_blocks,block_threads,name\n");
  for (const KernelRecord& r : g_records) {
    std::string name = r.name;
    std::replace(name.begin(), name.end(), ',', ';');  // one CSV field
    std::fprintf(out, "%llu,%llu,%u,%lld,%d,%s\n", (unsigned long long)r.start, (unsigned long long)r.end, r.stream,
                 (long long)r.blocks, r.threads, name.c_str());
  }
  if (out != stderr) std::fclose(out);
  if (g_dropped) std::fprintf(stderr, "dsv4_trace: CUPTI dropped %zu records\n", g_dropped);
}

}  // namespace

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library.
extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enabling kernel activity");
  std::atexit(write_trace);
  return 1;
}
