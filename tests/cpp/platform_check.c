/* platform_check.c — what tests/test_platforms.py compares between Linux, Windows (under Wine) and
 * ARM64 (under QEMU): a hash of the bytes fastllm_quantize gives for one matrix in every quantized
 * dtype (the converter's search must round alike everywhere), the status of loading MODEL, and
 * with a model, a session state saved to
 * STATE twice (the second save replaces the first) and restored into a new session, and the greedy
 * continuation from the restored session. Paths are UTF-8: on Windows the arguments are taken
 * from the wide-character command line, as a Windows program must do to see non-ANSI names.
 * Usage: platform_check MODEL STATE PROMPT N_TOKENS [read]   ("read": read the file, no mapping) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastllm.h"

#ifdef _WIN32
#include <windows.h>
#include <shellapi.h>
static char **utf8_argv(int *argc) {
    wchar_t **w = CommandLineToArgvW(GetCommandLineW(), argc);
    char **out = calloc((size_t)*argc + 1, sizeof *out);
    for (int i = 0; i < *argc; i++) {
        int n = WideCharToMultiByte(CP_UTF8, 0, w[i], -1, NULL, 0, NULL, NULL);
        out[i] = malloc((size_t)n);
        WideCharToMultiByte(CP_UTF8, 0, w[i], -1, out[i], n, NULL, NULL);
    }
    LocalFree(w);
    return out;
}
#endif

/* FNV-1a of fastllm_quantize's bytes for a 20 x 384 matrix in each quantized dtype, in turn: a
 * row of zeros, the others (u - 1/2) 2^-(r % 7) for u from a 32-bit LCG (exact in float32;
 * test_platforms.py makes the same matrix). */
static unsigned long long quantize_hash(void) {
    static const char *dtypes[] = {"q8", "q4", "q4_g64", "q4_g128", "q4m", "q6", "q4k", "q6k", "q3k", "q5k"};
    enum { ROWS = 20, COLS = 384 };
    static float w[ROWS * COLS];
    unsigned int x = 12345u;
    unsigned long long h = 0xcbf29ce484222325ull;
    for (int i = 0; i < ROWS * COLS; i++) {
        x = x * 1664525u + 1013904223u;
        w[i] = i / COLS == 3 ? 0.0f : ((float)(x >> 8) / 16777216.0f - 0.5f) / (float)(1 << (i / COLS % 7));
    }
    for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++) {
        size_t n = fastllm_quantized_size(dtypes[d], ROWS, COLS);
        unsigned char *out = malloc(n ? n : 1);
        if (!n || !out || fastllm_quantize(dtypes[d], w, ROWS, COLS, 0, ROWS, 0, out, n) != FASTLLM_OK) {
            free(out);
            return 0;
        }
        for (size_t i = 0; i < n; i++) h = (h ^ out[i]) * 0x100000001b3ull;
        free(out);
    }
    return h;
}

static int print_piece(const char *text, size_t len, void *user_data) {
    (void)user_data;
    fwrite(text, 1, len, stdout);
    return 0;
}

int main(int argc, char **argv) {
#ifdef _WIN32
    argv = utf8_argv(&argc);
#endif
    if (argc < 5) {
        fprintf(stderr, "usage: platform_check MODEL STATE PROMPT N_TOKENS [read]\n");
        return 2;
    }
    printf("isa: %s\n", fastllm_isa());
    printf("quantize: %016llx\n", quantize_hash());
    fastllm_model *model = NULL;
    fastllm_session *a = NULL, *b = NULL;
    fastllm_model_params mp = fastllm_model_default_params();
    mp.use_mmap = !(argc > 5 && strcmp(argv[5], "read") == 0);
    fastllm_status st = fastllm_model_load(argv[1], &mp, &model);
    printf("load: %s\n", fastllm_status_name(st));
    if (st != FASTLLM_OK) {
        printf("message: %s\n", fastllm_last_error());
        return 0;
    }
    int32_t tokens[256];
    size_t n = 0;
    st = fastllm_tokenize(model, argv[3], strlen(argv[3]), -1, tokens, 256, &n);
    if (st == FASTLLM_OK) st = fastllm_session_create(model, NULL, &a);
    if (st == FASTLLM_OK) st = fastllm_session_eval(a, tokens, n, FASTLLM_LOGITS_NONE, NULL);
    if (st == FASTLLM_OK) st = fastllm_session_save_state_file(a, argv[2]);
    printf("save: %s\n", fastllm_status_name(st));
    if (st == FASTLLM_OK) st = fastllm_session_save_state_file(a, argv[2]);
    printf("save again: %s\n", fastllm_status_name(st));
    if (st == FASTLLM_OK) st = fastllm_session_create(model, NULL, &b);
    if (st == FASTLLM_OK) st = fastllm_session_load_state_file(b, argv[2], NULL, NULL);
    printf("restore: %s (%d tokens)\n", fastllm_status_name(st), st == FASTLLM_OK ? fastllm_session_n_tokens(b) : 0);
    if (st == FASTLLM_OK) {
        fastllm_sampling_params sp = fastllm_sampling_default_params();
        sp.temperature = 0.0f;
        sp.max_new_tokens = atoi(argv[4]);
        fputs("text: ", stdout);
        st = fastllm_session_generate(b, NULL, 0, &sp, print_piece, NULL, NULL);
        printf("\ngenerate: %s\n", fastllm_status_name(st));
    }
    if (st != FASTLLM_OK) printf("message: %s\n", fastllm_last_error());
    fastllm_session_free(a);
    fastllm_session_free(b);
    fastllm_model_free(model);
    return 0;
}
