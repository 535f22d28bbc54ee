// dsv4 info: what this binary was built with and which devices it can use.
#include <cstdio>
#include <string>

#include "commands.h"
#include "cuda/device.h"
#include "engine/backend.h"

namespace dsv4::cli {

int cmd_info(int argc, char** argv) {
  (void)argc;
  (void)argv;
  std::printf("dsv4 backends: cpu%s\n", cuda_compiled() ? ", cuda" : "");
  std::printf("default backend: %s, numerics %s (--backend, --numerics)\n", resolve_backend_name("auto").c_str(),
              numerics_name(parse_numerics("auto", resolve_backend_name("auto"))));
  std::string why;
  const auto devices = cuda_devices(&why);
  if (devices.empty()) std::printf("cuda devices: none (%s)\n", why.c_str());
  for (const auto& d : devices)
    std::printf("cuda device %d: %s, sm_%d%d, %d SMs, %.1f GiB\n", d.index, d.name.c_str(), d.sm_major, d.sm_minor,
                d.multiprocessors, double(d.memory_bytes) / (1u << 30));
  return 0;
}

}  // namespace dsv4::cli
