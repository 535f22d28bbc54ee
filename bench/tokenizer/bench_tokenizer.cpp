// Tokenizer throughput: encode MB/s (single thread and all threads), decode MB/s and streaming-decode MB/s
// on the parity corpus (tests/data/tokenizer/samples.jsonl.gz, ~1.9 MB of mixed text). The Hugging Face
// numbers on the same text come from tools/tokenizer/bench_hf.py, which can run this binary and print both.
//
//   bench_tokenizer [--tokenizer v3|v4|PATH] [--repeat N] [--threads N] [--json]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tokenizer/fixtures.h"
#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string which = "v3";
  int repeat = 5;
  int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  bool as_json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) which = argv[++i];
    else if (a == "--repeat" && i + 1 < argc) repeat = std::max(1, std::atoi(argv[++i]));
    else if (a == "--threads" && i + 1 < argc) threads = std::max(1, std::atoi(argv[++i]));
    else if (a == "--json") as_json = true;
    else {
      std::fprintf(stderr, "usage: bench_tokenizer [--tokenizer v3|v4|PATH] [--repeat N] [--threads N] [--json]\n");
      return 1;
    }
  }
  try {
    const std::string data_dir = DSV4_TOKENIZER_DATA_DIR;
    const auto t_load = Clock::now();
    const dsv4::Tokenizer tok = which == "v3"   ? dsv4::tokfix::load_v3(data_dir)
                                : which == "v4" ? dsv4::tokfix::load_v4(data_dir)
                                                : dsv4::Tokenizer::from_file(which);
    const double load_s = seconds_since(t_load);
    const std::vector<dsv4::tokfix::Sample> samples = dsv4::tokfix::read_samples(data_dir);
    size_t bytes = 0;
    for (const auto& s : samples) bytes += s.text.size();
    const double mb = double(bytes) / 1e6;

    std::vector<std::vector<int32_t>> ids(samples.size());
    std::vector<double> encode_s, encode_mt_s, decode_s, stream_s;
    size_t tokens = 0;
    for (int r = 0; r < repeat; ++r) {
      auto t0 = Clock::now();
      for (size_t i = 0; i < samples.size(); ++i) ids[i] = tok.encode(samples[i].text);
      encode_s.push_back(seconds_since(t0));

      t0 = Clock::now();
      std::atomic<size_t> next{0};
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t)
        pool.emplace_back([&] {
          for (size_t i; (i = next.fetch_add(1)) < samples.size();) ids[i] = tok.encode(samples[i].text);
        });
      for (auto& th : pool) th.join();
      encode_mt_s.push_back(seconds_since(t0));

      t0 = Clock::now();
      size_t decoded = 0;
      for (const auto& v : ids) decoded += tok.decode(v).size();
      decode_s.push_back(seconds_since(t0));
      if (decoded != bytes) std::fprintf(stderr, "warning: decoded %zu bytes of %zu\n", decoded, bytes);

      t0 = Clock::now();
      for (const auto& v : ids) {
        dsv4::StreamDecoder stream(tok);
        for (int32_t id : v) stream.push(id);
        stream.finish();
      }
      stream_s.push_back(seconds_since(t0));
    }
    tokens = 0;
    for (const auto& v : ids) tokens += v.size();

    const double enc = mb / median(encode_s), enc_mt = mb / median(encode_mt_s);
    const double dec = mb / median(decode_s), stream = mb / median(stream_s);
    if (as_json) {
      std::printf("{\"tokenizer\": \"%s\", \"bytes\": %zu, \"samples\": %zu, \"tokens\": %zu, \"load_s\": %.3f, "
                  "\"encode_mb_s\": %.3f, \"encode_mt_mb_s\": %.3f, \"threads\": %d, \"decode_mb_s\": %.3f, "
                  "\"stream_decode_mb_s\": %.3f}\n",
                  which.c_str(), bytes, samples.size(), tokens, load_s, enc, enc_mt, threads, dec, stream);
    } else {
      std::printf("dsv4 tokenizer (%s): %zu samples, %.2f MB, %zu tokens, load %.2f s, median of %d runs\n",
                  which.c_str(), samples.size(), mb, tokens, load_s, repeat);
      std::printf("| encode 1 thread | encode %d threads | decode | stream decode |\n", threads);
      std::printf("|---|---|---|---|\n");
      std::printf("| %.2f MB/s (%.2f Mtok/s) | %.2f MB/s | %.1f MB/s | %.1f MB/s |\n", enc,
                  double(tokens) / median(encode_s) / 1e6, enc_mt, dec, stream);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
