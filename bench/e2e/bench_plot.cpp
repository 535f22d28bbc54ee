#include "e2e/bench_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

namespace dsv4 {

namespace {

// Plot geometry, in SVG pixels.
constexpr double kLeft = 80, kRight = 24, kMinPlotWidth = 720;
constexpr double kBar = 26, kBarGap = 8, kGroupGap = 40;   // decode: bars of a context, groups of contexts
constexpr double kPrefillBar = 44, kPrefillGap = 28;
constexpr double kDecodeHeight = 280, kPrefillHeight = 170;
// One colour per batch size, in the order the run measured them (repeating past eight).
constexpr const char* kPalette[] = {"#2563eb", "#f59e0b", "#16a34a", "#9333ea",
                                    "#dc2626", "#0891b2", "#db2777", "#65a30d"};

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A label: three significant digits (0.0123, 4.56, 789), whole numbers from 1000 on.
std::string label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, std::fabs(v) >= 1000 ? "%.0f" : "%.3g", v);
  return buf;
}

// A coordinate.
std::string at(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

class Svg {
 public:
  void line(double x1, double y1, double x2, double y2, const char* cls) {
    body_ << "<line class=\"" << cls << "\" x1=\"" << at(x1) << "\" y1=\"" << at(y1) << "\" x2=\"" << at(x2)
          << "\" y2=\"" << at(y2) << "\"/>\n";
  }
  void rect(double x, double y, double w, double h, const char* cls, const std::string& fill) {
    body_ << "<rect class=\"" << cls << "\" x=\"" << at(x) << "\" y=\"" << at(y) << "\" width=\"" << at(w)
          << "\" height=\"" << at(std::max(h, 0.0)) << "\" fill=\"" << fill << "\"/>\n";
  }
  // anchor: start, middle or end.
  void text(double x, double y, const std::string& s, const char* cls, const char* anchor = "start") {
    body_ << "<text class=\"" << cls << "\" x=\"" << at(x) << "\" y=\"" << at(y) << "\" text-anchor=\"" << anchor
          << "\">" << escape(s) << "</text>\n";
  }
  // The y axis' title, left of its labels, centred on `y`.
  void axis_title(double y, const std::string& s) {
    body_ << "<text class=\"axis-title\" transform=\"translate(" << at(kLeft - 52) << "," << at(y)
          << ") rotate(-90)\" text-anchor=\"middle\">" << escape(s) << "</text>\n";
  }
  // A measurement with its spread: a bar to `mean`, a whisker from `lo` to `hi` (pixels).
  void bar(double x, double w, double bottom, double mean, double lo, double hi, const char* cls,
           const std::string& fill) {
    rect(x, mean, w, bottom - mean, cls, fill);
    line(x + w / 2, lo, x + w / 2, hi, "range");
    line(x + w / 2 - 4, hi, x + w / 2 + 4, hi, "range");
    line(x + w / 2 - 4, lo, x + w / 2 + 4, lo, "range");
  }
  std::ostringstream& raw() { return body_; }
  std::string str() const { return body_.str(); }

 private:
  std::ostringstream body_;
};

// A linear axis from 0: a round step (1, 2, 2.5 or 5 × 10^k) near max / 4 and the top it reaches.
std::pair<double, double> linear_axis(double max) {
  if (!(max > 0)) max = 1;
  const double raw = max / 4, p = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * p;
  for (double m : {1.0, 2.0, 2.5, 5.0})
    if (m * p >= raw) {
      step = m * p;
      break;
    }
  return {step, std::ceil(max / step - 1e-9) * step};
}

std::string model_name(const BenchReport& r) {
  if (!r.synth.is_null())
    return "synthesised " + r.synth.value("preset", std::string("checkpoint")) + " (" +
           std::to_string(r.synth.value("layers", int64_t(0))) + " layers)";
  const std::filesystem::path dir = std::filesystem::path(r.model_dir).lexically_normal();
  return dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
}

// The decode panel from `top`: per context a group of bars, one per batch size, measured ms per step on a log
// scale with the floor across each bar. Returns the panel's bottom.
double decode_panel(Svg& svg, const BenchReport& r, double top, double width) {
  std::vector<int64_t> contexts, batches;
  for (const DecodeRow& d : r.decode) {
    if (std::find(contexts.begin(), contexts.end(), d.context) == contexts.end()) contexts.push_back(d.context);
    if (std::find(batches.begin(), batches.end(), d.batch) == batches.end()) batches.push_back(d.batch);
  }
  const auto colour = [&](int64_t batch) {
    return std::string(kPalette[size_t(std::find(batches.begin(), batches.end(), batch) - batches.begin()) %
                                std::size(kPalette)]);
  };

  svg.text(kLeft, top, "Decode: ms per step (log scale) against the floor, with its percentage", "heading");
  // Legend: the batch colours, the floor mark, the whisker.
  double x = kLeft;
  for (int64_t b : batches) {
    svg.rect(x, top + 10, 12, 10, "swatch", colour(b));
    svg.text(x + 16, top + 19, "batch " + std::to_string(b), "legend");
    x += 30 + 7.0 * double(std::to_string(b).size()) + 40;
  }
  svg.line(x, top + 15, x + 16, top + 15, "floor");
  svg.text(x + 20, top + 19, "floor (bytes / bandwidth)", "legend");
  x += 170;
  svg.line(x + 6, top + 10, x + 6, top + 21, "range");
  svg.text(x + 14, top + 19, "min–max of the repetitions", "legend");

  const double plot_top = top + 40, bottom = plot_top + kDecodeHeight;
  double lo = 1e300, hi = 0;
  for (const DecodeRow& d : r.decode) {
    lo = std::min({lo, d.ms_per_step.min, d.floor.seconds * 1e3});
    hi = std::max({hi, d.ms_per_step.max, d.floor.seconds * 1e3});
  }
  const int d0 = int(std::floor(std::log10(std::max(lo, 1e-9))));
  const int d1 = std::max(int(std::ceil(std::log10(std::max(hi, 1e-9)))), d0 + 1);
  const auto y = [&](double ms) {
    return bottom - (std::log10(std::max(ms, 1e-12)) - d0) / double(d1 - d0) * kDecodeHeight;
  };
  for (int k = d0; k <= d1; ++k) {
    const double v = std::pow(10.0, k);
    svg.line(kLeft, y(v), kLeft + width, y(v), k == d0 ? "axis" : "grid");
    svg.text(kLeft - 6, y(v) + 4, label(v), "tick", "end");
    if (k == d1) break;
    for (double m : {2.0, 5.0}) {
      svg.line(kLeft, y(m * v), kLeft + width, y(m * v), "minor");
      if (d1 - d0 <= 2) svg.text(kLeft - 6, y(m * v) + 4, label(m * v), "tick", "end");
    }
  }
  svg.axis_title(plot_top + kDecodeHeight / 2, "ms per step");

  x = kLeft + 16;
  for (int64_t c : contexts) {
    const double group_left = x;
    for (const DecodeRow& d : r.decode) {
      if (d.context != c) continue;
      const double floor_ms = d.floor.seconds * 1e3;
      svg.raw() << "<g class=\"decode-row\" data-context=\"" << d.context << "\" data-batch=\"" << d.batch << "\">\n"
                << "<title>context " << d.context << ", batch " << d.batch << ": " << label(d.ms_per_step.mean)
                << " ms per step (" << label(d.ms_per_step.min) << "–" << label(d.ms_per_step.max) << "), floor "
                << label(floor_ms) << " ms: " << label(d.achieved * 100) << "% of the floor</title>\n";
      svg.bar(x, kBar, bottom, y(d.ms_per_step.mean), y(d.ms_per_step.min), y(d.ms_per_step.max), "measured",
              colour(d.batch));
      svg.line(x - 4, y(floor_ms), x + kBar + 4, y(floor_ms), "floor");
      svg.text(x + kBar / 2, std::min(y(d.ms_per_step.max), y(floor_ms)) - 6, label(d.achieved * 100) + "%",
               "achieved", "middle");
      svg.text(x + kBar / 2, bottom + 14, std::to_string(d.batch), "batch", "middle");
      svg.raw() << "</g>\n";
      x += kBar + kBarGap;
    }
    svg.text((group_left + x - kBarGap) / 2, bottom + 32, "context " + std::to_string(c), "context", "middle");
    x += kGroupGap - kBarGap;
  }
  return bottom + 32;
}

// The prefill panel from `top`: tokens per second of every prompt length. Returns its bottom.
double prefill_panel(Svg& svg, const BenchReport& r, double top, double width) {
  svg.text(kLeft, top, "Prefill: tokens per second", "heading");
  const double plot_top = top + 24, bottom = plot_top + kPrefillHeight;
  double hi = 0;
  for (const PrefillRow& p : r.prefill) hi = std::max(hi, p.tokens_per_s.max);
  const auto [step, axis_top] = linear_axis(hi);
  const auto y = [&](double v) { return bottom - v / axis_top * kPrefillHeight; };
  for (double v = 0; v <= axis_top + step / 2; v += step) {
    svg.line(kLeft, y(v), kLeft + width, y(v), v == 0 ? "axis" : "grid");
    svg.text(kLeft - 6, y(v) + 4, label(v), "tick", "end");
  }
  svg.axis_title(plot_top + kPrefillHeight / 2, "tokens/s");
  double x = kLeft + 16;
  for (const PrefillRow& p : r.prefill) {
    svg.raw() << "<g class=\"prefill-row\" data-tokens=\"" << p.tokens << "\">\n<title>" << p.tokens
              << " prompt tokens: " << label(p.tokens_per_s.mean) << " tokens/s, " << label(p.ms.mean)
              << " ms</title>\n";
    svg.bar(x, kPrefillBar, bottom, y(p.tokens_per_s.mean), y(p.tokens_per_s.min), y(p.tokens_per_s.max), "measured",
            "#64748b");
    svg.text(x + kPrefillBar / 2, y(p.tokens_per_s.max) - 6, label(p.tokens_per_s.mean), "achieved", "middle");
    svg.text(x + kPrefillBar / 2, bottom + 14, std::to_string(p.tokens) + " tokens", "batch", "middle");
    svg.raw() << "</g>\n";
    x += kPrefillBar + kPrefillGap;
  }
  return bottom + 14;
}

}  // namespace

std::string bench_svg(const BenchReport& r) {
  // The plot is as wide as the widest panel needs.
  std::vector<int64_t> contexts;
  for (const DecodeRow& d : r.decode)
    if (std::find(contexts.begin(), contexts.end(), d.context) == contexts.end()) contexts.push_back(d.context);
  const double decode_width = 32 + double(r.decode.size()) * (kBar + kBarGap) +
                              double(contexts.size()) * (kGroupGap - kBarGap);
  const double prefill_width = 32 + double(r.prefill.size()) * (kPrefillBar + kPrefillGap);
  const double width = std::max({kMinPlotWidth, decode_width, prefill_width});

  Svg svg;
  svg.text(kLeft, 28, "dsv4 bench: " + model_name(r), "title");
  svg.text(kLeft, 48,
           r.backend + " on " + r.device + " · numerics " + r.numerics + " · " +
               parallelism_name(r.options.parallelism) + " · " + std::to_string(r.layers) + " layers, " +
               std::to_string(r.experts) + " experts (top-" + std::to_string(r.experts_per_tok) + ")",
           "subtitle");
  svg.text(kLeft, 66, "copy bandwidth " + label(r.bandwidth / 1e9) + " GB/s (" + r.bandwidth_method + ")", "subtitle");
  svg.text(kLeft, 84,
           std::to_string(r.options.reps) + " repetitions · " + std::to_string(r.options.decode_steps) +
               " decode steps each, one token per sequence a step, " +
               decode_output(r.options),
           "subtitle");
  double y = 84;
  if (!r.decode.empty()) y = decode_panel(svg, r, y + 40, width);
  if (!r.prefill.empty()) y = prefill_panel(svg, r, y + 40, width);
  svg.text(kLeft, y + 30, "floor = (dense weights + the routed experts a batch is expected to select + the KV cache",
           "note");
  svg.text(kLeft, y + 46, "each sequence reads, as the backend stores them) / copy bandwidth", "note");
  const double total_width = kLeft + width + kRight, total_height = y + 60;

  std::ostringstream out;
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << at(total_width) << "\" height=\"" << at(total_height)
      << "\" viewBox=\"0 0 " << at(total_width) << " " << at(total_height) << "\">\n"
      << "<style>\n"
         "text { font-family: system-ui, 'Segoe UI', Roboto, Arial, sans-serif; font-size: 11px; fill: #374151; }\n"
         ".title { font-size: 17px; font-weight: bold; fill: #111827; }\n"
         ".subtitle, .note { font-size: 12px; fill: #4b5563; }\n"
         ".heading { font-size: 13px; font-weight: bold; fill: #111827; }\n"
         ".tick, .legend, .batch { fill: #4b5563; }\n"
         ".context { font-weight: bold; }\n"
         ".achieved { font-size: 10px; fill: #111827; }\n"
         ".axis { stroke: #9ca3af; } .grid { stroke: #e5e7eb; } .minor { stroke: #f3f4f6; }\n"
         ".floor { stroke: #111827; stroke-width: 2.5; } .range { stroke: #111827; stroke-width: 1; }\n"
         ".measured { opacity: 0.85; }\n"
         "</style>\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
      << svg.str() << "</svg>\n";
  return out.str();
}

}  // namespace dsv4
