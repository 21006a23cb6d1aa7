// The cuda component of the installed package compiles and links in a consumer (run without
// a GPU, it only reports how many devices it sees).
#include <cstdio>

#include "eredu/cuda/backend.hpp"
#include "eredu/cuda/device.hpp"

int main() {
  std::printf("consumer_cuda: %d CUDA device(s)\n", eredu::cuda::device_count());
  return 0;
}
