#pragma once
// The shape of the tiny Llama the MPI tests swap across ranks: small enough for any host, with
// every kind of shard (rows, columns, grouped KV heads).

#include <cstdint>

namespace eredu::test::tiny_llama {

/// Its dimensions: per attention head, heads, KV heads, the hidden size, the MLP size.
inline constexpr std::uint64_t head_dim = 4, heads = 8, kv_heads = 4, hidden = heads * head_dim, inter = 48;

}  // namespace eredu::test::tiny_llama
