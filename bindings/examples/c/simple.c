/* simple.c — load a .flm model, stream a greedy continuation of a prompt, free everything.
 * Usage: simple_c MODEL.flm "prompt" [max_new_tokens] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastllm.h"

static int print_piece(const char *text, size_t len, void *user_data) {
    (void)user_data;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0; /* 0 = keep going */
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.flm \"prompt\" [max_new_tokens]\n", argv[0]);
        return 2;
    }
    fastllm_model *model = NULL;
    fastllm_session *session = NULL;
    int32_t *tokens = NULL;
    int rc = 1;
    fastllm_status st;

    if ((st = fastllm_model_load(argv[1], NULL, &model)) != FASTLLM_OK) goto fail;
    if ((st = fastllm_session_create(model, NULL, &session)) != FASTLLM_OK) goto fail;

    /* Ask for the size first, then tokenize into a buffer of that size. */
    size_t n_tokens = 0;
    const char *prompt = argv[2];
    st = fastllm_tokenize(model, prompt, strlen(prompt), -1, NULL, 0, &n_tokens);
    if (st != FASTLLM_OK && st != FASTLLM_ERR_BUFFER_TOO_SMALL) goto fail;
    tokens = malloc(n_tokens * sizeof *tokens);
    st = FASTLLM_ERR_OUT_OF_MEMORY;
    if (!tokens || (st = fastllm_tokenize(model, prompt, strlen(prompt), -1, tokens, n_tokens, &n_tokens)) != FASTLLM_OK) goto fail;

    fastllm_sampling_params sp = fastllm_sampling_default_params();
    sp.temperature = 0.0f; /* greedy */
    sp.max_new_tokens = argc > 3 ? atoi(argv[3]) : 64;
    fastllm_generation_result res;
    fputs(prompt, stdout);
    if ((st = fastllm_session_generate(session, tokens, n_tokens, &sp, print_piece, NULL, &res)) != FASTLLM_OK) goto fail;
    printf("\n[%d prompt tokens, %d generated, %.1f tokens/s]\n", res.n_prompt_tokens, res.n_generated_tokens,
           res.generate_ms > 0 ? res.n_generated_tokens * 1000.0 / res.generate_ms : 0.0);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "error: %s: %s\n", fastllm_status_name(st), fastllm_last_error());
done:
    free(tokens);
    fastllm_session_free(session);
    fastllm_model_free(model);
    return rc;
}
