// The hash of the sources this module was built from, as a string literal. The build passes it
// as -DMEGATRON_FUSED_SOURCE_HASH=<64 hex digits>, a bare token (megatron/core/fusions/source_hash.py
// says why); the loader compares it with the hash of the checkout's sources and rebuilds on a mismatch.
#pragma once

#define MEGATRON_FUSED_STRINGIFY2(x) #x
#define MEGATRON_FUSED_STRINGIFY(x) MEGATRON_FUSED_STRINGIFY2(x)
#ifdef MEGATRON_FUSED_SOURCE_HASH
#define MEGATRON_FUSED_SOURCE_HASH_STRING MEGATRON_FUSED_STRINGIFY(MEGATRON_FUSED_SOURCE_HASH)
#else
#define MEGATRON_FUSED_SOURCE_HASH_STRING "unknown"  // built without the flag: never matches, so rebuilt
#endif
