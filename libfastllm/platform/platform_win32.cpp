// Windows: wide-character file APIs on UTF-8 paths, CreateFileMapping / MapViewOfFile, _aligned_malloc.
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>

#include <malloc.h>

#include <algorithm>

#include <string>

#include "base/error.h"
#include "platform/platform.h"

namespace fastllm::platform {

namespace {

// UTF-8 to UTF-16; invalid UTF-8 is an error (it names no file).
std::wstring wide(const char *utf8) {
    const int n = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, utf8, -1, nullptr, 0);
    if (n <= 0) fail(FASTLLM_ERR_INVALID_ARGUMENT, "'%s': the path is not valid UTF-8", utf8);
    std::wstring w((size_t)n, L'\0');
    MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, utf8, -1, &w[0], n);
    w.resize((size_t)n - 1);
    return w;
}

// The system's message for an error code, in UTF-8, without the trailing line break.
std::string reason(DWORD code) {
    wchar_t *buf = nullptr;
    const DWORD n = FormatMessageW(FORMAT_MESSAGE_ALLOCATE_BUFFER | FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS,
                                   nullptr, code, 0, (LPWSTR)&buf, 0, nullptr);
    std::string out;
    if (n > 0) {
        const int len = WideCharToMultiByte(CP_UTF8, 0, buf, (int)n, nullptr, 0, nullptr, nullptr);
        out.resize((size_t)len);
        WideCharToMultiByte(CP_UTF8, 0, buf, (int)n, &out[0], len, nullptr, nullptr);
        LocalFree(buf);
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' ')) out.pop_back();
    return out.empty() ? "error " + std::to_string(code) : out;
}

}  // namespace

FileBytes read_file(const std::string &path, bool use_mmap, size_t alignment) {
    const std::wstring wpath = wide(path.c_str());
    HANDLE h = CreateFileW(wpath.c_str(), GENERIC_READ, FILE_SHARE_READ, nullptr, OPEN_EXISTING,
                           FILE_ATTRIBUTE_NORMAL | FILE_FLAG_SEQUENTIAL_SCAN, nullptr);
    if (h == INVALID_HANDLE_VALUE) fail(FASTLLM_ERR_IO, "cannot open '%s': %s", path.c_str(), reason(GetLastError()).c_str());
    LARGE_INTEGER size;
    if (GetFileType(h) != FILE_TYPE_DISK || !GetFileSizeEx(h, &size)) {
        CloseHandle(h);
        fail(FASTLLM_ERR_IO, "'%s' is not a regular file", path.c_str());
    }
    FileBytes f;
    f.size = (uint64_t)size.QuadPart;
    if (f.size == 0) {
        CloseHandle(h);
        return f;
    }
    if (use_mmap) {
        // The view keeps the file open: both handles can go once it exists.
        HANDLE m = CreateFileMappingW(h, nullptr, PAGE_READONLY, 0, 0, nullptr);
        void *p = m ? MapViewOfFile(m, FILE_MAP_READ, 0, 0, 0) : nullptr;
        const DWORD e = GetLastError();
        if (m) CloseHandle(m);
        CloseHandle(h);
        if (!p)
            fail(e == ERROR_NOT_ENOUGH_MEMORY ? FASTLLM_ERR_OUT_OF_MEMORY : FASTLLM_ERR_IO, "cannot map '%s': %s",
                 path.c_str(), reason(e).c_str());
        f.data = (const uint8_t *)p;
        f.mapped = true;
        return f;
    }
    void *buf = aligned_alloc(alignment, f.size);
    if (!buf) {
        CloseHandle(h);
        fail(FASTLLM_ERR_OUT_OF_MEMORY, "cannot allocate %llu bytes for '%s'", (unsigned long long)f.size, path.c_str());
    }
    for (uint64_t done = 0; done < f.size;) {
        const DWORD want = (DWORD)std::min<uint64_t>(f.size - done, 1u << 30);  // ReadFile takes 32-bit counts
        DWORD got = 0;
        if (!ReadFile(h, (char *)buf + done, want, &got, nullptr) || got == 0) {
            const DWORD e = GetLastError();
            aligned_free(buf);
            CloseHandle(h);
            fail(FASTLLM_ERR_IO, "cannot read '%s': %s", path.c_str(), got == 0 ? "unexpected end" : reason(e).c_str());
        }
        done += got;
    }
    CloseHandle(h);
    f.data = (const uint8_t *)buf;
    return f;
}

void release_file(const FileBytes &f) {
    if (!f.data) return;
    if (f.mapped)
        UnmapViewOfFile(f.data);
    else
        aligned_free((void *)f.data);
}

void *aligned_alloc(size_t alignment, size_t bytes) { return _aligned_malloc(bytes ? bytes : alignment, alignment); }

void aligned_free(void *p) { _aligned_free(p); }

FILE *fopen_utf8(const char *path, const char *mode) {
    try {
        return _wfopen(wide(path).c_str(), wide(mode).c_str());
    } catch (const Error &) {
        return nullptr;
    }
}

bool replace_file(const char *from, const char *to) {
    try {
        return MoveFileExW(wide(from).c_str(), wide(to).c_str(), MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH) != 0;
    } catch (const Error &) {
        return false;
    }
}

bool remove_file(const char *path) {
    try {
        return DeleteFileW(wide(path).c_str()) != 0;
    } catch (const Error &) {
        return false;
    }
}

void *open_library(const char *name) { return (void *)LoadLibraryA(name); }
void *library_symbol(void *library, const char *name) {
    return library ? (void *)GetProcAddress((HMODULE)library, name) : nullptr;
}

}  // namespace fastllm::platform
