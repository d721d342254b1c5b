// libFuzzer target: a .safetensors file as model/safetensors opens it (the 8-byte header
// length, the JSON header, dtypes, shapes, offsets). The bytes go to an in-memory file
// (memfd), opened through /proc like any checkpoint shard. A file that opens has every
// tensor inside the mapping, with the byte size its dtype and shape say; one that does not
// gets a message naming the file.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shoal::model;
  const int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  for (size_t done = 0; done < size;) {
    const ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto f = safetensors_file::open(path);
  if (!f) {
    if (f.error().message.find(path) == std::string::npos) std::abort();
  } else {
    unsigned sum = 0;
    for (const auto& [name, t] : (*f)->tensors()) {
      size_t elems = 1;
      for (int64_t d : t.shape) {
        if (d < 0) std::abort();
        elems *= static_cast<size_t>(d);
      }
      if (elems * dtype_size(t.type) != t.nbytes) std::abort();
      // Touch the first and last byte: both lie inside the mapping.
      if (t.nbytes > 0) sum += static_cast<unsigned>(t.data[0]) + static_cast<unsigned>(t.data[t.nbytes - 1]);
    }
    asm volatile("" : : "r"(sum));
  }
  close(fd);
  return 0;
}
