// test_threads.cpp — one model shared by many threads (docs/reliability.md; run by
// tests/test_threads.py, and under ThreadSanitizer by scripts/test_sanitizers.sh):
//   8 threads, each with its own session: greedy generation, truncate, generate on, reset, again;
//   2 threads tokenizing and detokenizing on the shared model;
//   1 thread rendering chat templates on it;
//   the odd session threads forking their session from one shared persona session (all at once),
//   whose KV blocks they then share;
//   1 thread generating while another cancels it (fastllm_session_cancel from another thread);
//   a log callback receiving every thread's messages.
// Every thread's outputs must equal the same work done first on one thread.
// Usage: test_threads MODEL.flm [ROUNDS]; exit 0 when every output matched.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fastllm.h"

namespace {

std::atomic<long> g_log_messages{0};

void on_log(fastllm_log_level, const char *message, void *) {
    if (message && message[0]) g_log_messages.fetch_add(1, std::memory_order_relaxed);
}

int collect(const char *text, size_t len, void *user) {
    static_cast<std::string *>(user)->append(text, len);
    return 0;
}

std::vector<int32_t> tokenize(const fastllm_model *m, const std::string &text) {
    std::vector<int32_t> ids(text.size() + 8);
    size_t n = 0;
    if (fastllm_tokenize(m, text.data(), text.size(), 1, ids.data(), ids.size(), &n) != FASTLLM_OK) return {};
    ids.resize(n);
    return ids;
}

const char *kPrompts[] = {"Once upon a time", "The little dog", "Lily and Tom went", "One day, a bird",
                          "There was a big tree", "Sam liked to", "The sun was", "A girl named Sue"};

// The session work of thread i: what it generated, each step's text joined with '|'. Odd threads
// start from a fork of persona (read by all of them at once, used by none).
std::string session_work(const fastllm_model *m, const fastllm_session *persona, int i, int rounds) {
    fastllm_session_params sp = fastllm_session_default_params();
    sp.n_ctx = 128;
    sp.n_threads = 1 + (i & 1);  // sessions of one and two threads
    fastllm_session *s = nullptr;
    const fastllm_status st = i & 1 ? fastllm_session_fork(persona, fastllm_session_n_tokens(persona), &sp, &s)
                                    : fastllm_session_create(m, &sp, &s);
    if (st != FASTLLM_OK) return std::string("create failed: ") + fastllm_last_error();
    fastllm_sampling_params gp = fastllm_sampling_default_params();
    gp.max_new_tokens = 12;
    gp.temperature = i < 4 ? 0.0f : 0.9f;  // greedy and seeded sampling
    gp.seed = 7 + i;
    std::string out;
    for (int r = 0; r < rounds; r++) {
        std::vector<int32_t> prompt = tokenize(m, kPrompts[(i + r) % 8]);
        fastllm_generation_result res;
        if (fastllm_session_generate(s, prompt.data(), prompt.size(), &gp, collect, &out, &res) != FASTLLM_OK)
            out += std::string("[error ") + fastllm_last_error() + "]";
        out += '|';
        fastllm_session_truncate(s, (int32_t)prompt.size());  // back to the prompt, generate on from it
        if (fastllm_session_generate(s, nullptr, 0, &gp, collect, &out, &res) != FASTLLM_OK)
            out += std::string("[error ") + fastllm_last_error() + "]";
        out += '|';
        fastllm_session_reset(s);
    }
    fastllm_session_free(s);
    return out;
}

// A long generation that another thread cancels: "ok" when the two calls agree (cancelled, or
// finished before the cancel came and the cancel found nothing to stop).
std::string cancel_work(const fastllm_model *m) {
    fastllm_session *s = nullptr;
    if (fastllm_session_create(m, nullptr, &s) != FASTLLM_OK) return "create failed";
    fastllm_sampling_params gp = fastllm_sampling_default_params();
    gp.max_new_tokens = 200;
    gp.ignore_eos = 1;
    std::vector<int32_t> prompt = tokenize(m, kPrompts[0]);
    fastllm_generation_result res{};
    std::string text;
    std::thread gen([&] { fastllm_session_generate(s, prompt.data(), prompt.size(), &gp, collect, &text, &res); });
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const fastllm_status c = fastllm_session_cancel(s);
    gen.join();
    fastllm_session_free(s);
    const bool ok = c == FASTLLM_OK ? res.stop_reason == FASTLLM_STOP_CANCELLED
                                    : c == FASTLLM_ERR_INVALID_ARGUMENT && res.stop_reason == FASTLLM_STOP_MAX_TOKENS;
    return ok ? "ok" : "cancel " + std::to_string(c) + " stop reason " + std::to_string(res.stop_reason);
}

std::string tokenizer_work(const fastllm_model *m, int i, int rounds) {
    std::string out;
    for (int r = 0; r < rounds * 20; r++) {
        std::string text = std::string(kPrompts[(i + r) % 8]) + " " + std::to_string(r) + " é 🙂";
        std::vector<int32_t> ids = tokenize(m, text);
        char buf[512];
        size_t len = 0;
        if (fastllm_detokenize(m, ids.data(), ids.size(), buf, sizeof buf, &len) != FASTLLM_OK) return "detokenize failed";
        out.append(buf, len).append("|");
    }
    return out;
}

std::string template_work(const fastllm_model *m, int rounds) {
    const char *chatml = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                         "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
                         "{{ '<|im_start|>assistant\\n' }}{% endif %}";
    std::string out;
    for (int r = 0; r < rounds * 20; r++) {
        std::string content = "Hello " + std::to_string(r);
        fastllm_chat_message msgs[] = {{"system", "Be brief."}, {"user", content.c_str()}};
        char buf[512];
        size_t len = 0;
        if (fastllm_chat_apply_template(m, chatml, msgs, 2, 1, buf, sizeof buf, &len) != FASTLLM_OK) return "template failed";
        out.append(buf, len);
    }
    return out;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s MODEL.flm [ROUNDS]\n", argv[0]);
        return 2;
    }
    const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
    fastllm_log_set(on_log, nullptr);
    fastllm_model *m = nullptr;
    if (fastllm_model_load(argv[1], nullptr, &m) != FASTLLM_OK) {
        std::fprintf(stderr, "load: %s\n", fastllm_last_error());
        return 2;
    }
    const int n_sessions = 8, n_tokenizers = 2;
    fastllm_session *persona = nullptr;
    fastllm_session_params pp = fastllm_session_default_params();
    pp.n_ctx = 128;
    std::vector<int32_t> persona_ids = tokenize(m, "Once upon a time, in a big forest, there lived");
    if (fastllm_session_create(m, &pp, &persona) != FASTLLM_OK ||
        fastllm_session_eval(persona, persona_ids.data(), persona_ids.size(), FASTLLM_LOGITS_NONE, nullptr) != FASTLLM_OK) {
        std::fprintf(stderr, "persona: %s\n", fastllm_last_error());
        return 2;
    }
    const long logs_load = g_log_messages.load();
    // One thread first: the expected outputs.
    std::vector<std::string> expected;
    for (int i = 0; i < n_sessions; i++) expected.push_back(session_work(m, persona, i, rounds));
    for (int i = 0; i < n_tokenizers; i++) expected.push_back(tokenizer_work(m, i, rounds));
    expected.push_back(template_work(m, rounds));
    expected.push_back(cancel_work(m));  // "ok", else the comparison below reports it
    const long logs_alone = g_log_messages.load() - logs_load;

    std::vector<std::string> got(expected.size());
    std::vector<std::thread> threads;
    for (int i = 0; i < n_sessions; i++) threads.emplace_back([&, i] { got[i] = session_work(m, persona, i, rounds); });
    for (int i = 0; i < n_tokenizers; i++)
        threads.emplace_back([&, i] { got[n_sessions + i] = tokenizer_work(m, i, rounds); });
    threads.emplace_back([&] { got[got.size() - 2] = template_work(m, rounds); });
    threads.emplace_back([&] { got.back() = cancel_work(m); });
    for (auto &t : threads) t.join();
    fastllm_log_set(nullptr, nullptr);
    fastllm_session_free(persona);
    fastllm_model_free(m);

    int bad = 0;
    for (size_t i = 0; i < got.size(); i++)
        if (got[i] != expected[i]) {
            std::printf("thread %zu differs:\n  alone:    %.300s\n  together: %.300s\n", i, expected[i].c_str(),
                        got[i].c_str());
            bad++;
        }
    const long logs_together = g_log_messages.load() - logs_load - logs_alone;
    std::printf("%zu threads, %d rounds: %d differ; log messages %ld alone, %ld together\n", got.size(), rounds, bad,
                logs_alone, logs_together);
    if (expected.back() != "ok") {
        std::printf("cancel from another thread: %s\n", expected.back().c_str());
        bad++;
    }
    if (logs_together != logs_alone) {
        std::printf("the log callback missed messages\n");
        bad++;
    }
    return bad ? 1 : 0;
}
