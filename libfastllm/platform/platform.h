// platform.h — what the core needs from the operating system, one file per system
// (platform_posix.cpp, platform_win32.cpp; CMake compiles one), and the CPU's features
// (cpu_features.cpp). No other core file includes an OS header. Paths are UTF-8 everywhere (on Windows converted to the wide-character APIs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace fastllm::platform {

// A whole file in memory: mapped read-only (`mapped`), or read into a buffer aligned to `alignment`.
struct FileBytes {
    const uint8_t *data = nullptr;
    uint64_t size = 0;
    bool mapped = false;
};
// Maps (use_mmap) or reads the regular file at `path`; an empty file gives size 0 and no data.
// Failures throw through fail(): FASTLLM_ERR_IO (cannot open, not a regular file, read error) or
// FASTLLM_ERR_OUT_OF_MEMORY, the message naming the path and the system's reason.
FileBytes read_file(const std::string &path, bool use_mmap, size_t alignment);
void release_file(const FileBytes &f);

// Aligned heap memory (alignment a power of two, >= sizeof(void *)); nullptr when out of memory.
void *aligned_alloc(size_t alignment, size_t bytes);
void aligned_free(void *p);

// fopen with a UTF-8 path; nullptr on failure.
FILE *fopen_utf8(const char *path, const char *mode);
// Renames `from` to `to`, replacing `to` if it exists (one step where the system allows it).
bool replace_file(const char *from, const char *to);
bool remove_file(const char *path);

// A shared library opened at run time (a GPU API's loader, which a machine may lack): nullptr if
// it cannot be opened; symbols by name, nullptr if absent. Never closed: its code may be running
// in a driver's threads until the process ends.
void *open_library(const char *name);
void *library_symbol(void *library, const char *name);

// The instruction-set levels the kernels use (cpu/kernels.h) that this CPU and system run: avx2
// includes FMA and F16C, avx_vnni is avx2 plus AVX-VNNI, avx512 F + BW + VL + VNNI; amx is avx512
// plus AMX-TILE and AMX-INT8 with the tile data granted by the system (Linux asks that a process
// request it); neon_dotprod is ARMv8.2's SDOT/UDOT. Asked once per process (platform/cpu_features.cpp).
struct CpuFeatures {
    bool avx2 = false, avx_vnni = false, avx512 = false, amx = false, neon = false, neon_dotprod = false;
    bool amx_bf16 = false;  // amx, AMX-BF16 and AVX512-BF16 (every AMX CPU so far): the attention's products
};
const CpuFeatures &cpu_features();

}  // namespace fastllm::platform
