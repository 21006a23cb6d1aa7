#include "eredu/core/error.hpp"

#include <catch2/catch.hpp>
#include <string>

using namespace eredu;

TEST_CASE("error – message names file, tensor and offset, and code() is the kind", "[core][error]") {
  Error e(errc::invalid_offset, {.file = "a.safetensors", .tensor = "w", .offset = 42}, "gap before 8");
  std::string what = e.what();
  CHECK(what == "a.safetensors: tensor 'w': at offset 42: gap before 8 [invalid_offset]");
  CHECK(e.code() == errc::invalid_offset);
  CHECK(e.kind() == errc::invalid_offset);
  CHECK(e.code().category().name() == std::string("eredu"));
}

TEST_CASE("error – os errors are appended and unknown parts left out", "[core][error]") {
  Error e(errc::io_error, {.file = "f", .os_error = std::error_code(5, std::system_category())}, "read failed");
  std::string what = e.what();
  CHECK(what.find("f: read failed [io_error] (") == 0);
  CHECK(what.find("tensor") == std::string::npos);
}
