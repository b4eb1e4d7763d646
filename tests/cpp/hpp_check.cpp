// hpp_check.cpp — exercises bindings/examples/cpp/fastllm.hpp; tests/test_cpp_wrapper.py builds it
// and checks the "key=value" lines it prints (one per line, values without newlines).
// Usage: hpp_check MODEL.flm PROMPT N_NEW MISSING_PATH
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fastllm.hpp"

namespace {

struct Boom {
    int pieces;
};

void put(const char *key, const std::string &value) { std::printf("%s=%s\n", key, value.c_str()); }
void put(const char *key, long long value) { put(key, std::to_string(value)); }

fastllm::SamplingParams greedy(int n) {
    fastllm::SamplingParams sp;
    sp.temperature = 0.0f;
    sp.max_new_tokens = n;
    return sp;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s MODEL.flm PROMPT N_NEW MISSING_PATH\n", argv[0]);
        return 2;
    }
    const std::string prompt = argv[2];
    const int n_new = std::atoi(argv[3]);

    fastllm::Model model = fastllm::Model::load(argv[1], 2);
    put("info.arch", model.info().architecture);
    const std::vector<int32_t> ids = model.tokenize(prompt);
    std::string joined;
    for (int32_t id : ids) joined += model.token_to_piece(id);
    put("tokenize.n", static_cast<long long>(ids.size()));
    put("tokenize.bos_first", ids.size() > 0 && ids[0] == model.info().bos_id);
    put("tokenize.no_bos_n", static_cast<long long>(model.tokenize(prompt, false).size()));
    put("detokenize", model.detokenize(ids));
    put("pieces_joined", joined);

    fastllm::Session session(model, {/*n_ctx=*/256});
    put("session.n_ctx", session.n_ctx());

    // Greedy: the streamed pieces are the result's text.
    std::string streamed;
    auto r = session.generate(prompt, greedy(n_new), [&](std::string_view piece) {
        streamed += piece;
        return true;
    });
    put("greedy.text", r.text);
    put("greedy.streamed_same", streamed == r.text);
    put("greedy.n_prompt", r.n_prompt_tokens);
    put("greedy.n_generated", r.n_generated_tokens);
    put("greedy.stop", r.stop_reason_name());
    put("greedy.n_tokens", session.n_tokens());
    put("greedy.tokens_match", session.tokens().size() == static_cast<size_t>(session.n_tokens()));

    // The same prompt as ids, after reset: the same text.
    session.reset();
    put("ids.text", session.generate(ids, greedy(n_new)).text);

    // Returning false after three pieces stops there.
    session.reset();
    int calls = 0;
    r = session.generate(prompt, greedy(n_new), [&](std::string_view) { return ++calls < 3; });
    put("stop3.calls", calls);
    put("stop3.n_generated", r.n_generated_tokens);
    put("stop3.stop", r.stop_reason_name());

    // A stop string: not in the output.
    session.reset();
    fastllm::SamplingParams sp = greedy(n_new);
    sp.stop = {"Lily"};
    r = session.generate(prompt, sp);
    put("stopstr.text", r.text);
    put("stopstr.stop", r.stop_reason_name());

    // An exception in the callback comes out of generate() as itself; the session stays usable.
    session.reset();
    int seen = 0;
    try {
        session.generate(prompt, greedy(n_new), [&](std::string_view) -> bool {
            if (++seen == 2) throw Boom{seen};
            return true;
        });
        put("throw.caught", "none");
    } catch (const Boom &b) {
        put("throw.caught", "Boom" + std::to_string(b.pieces));
    }
    put("throw.calls", seen);
    put("throw.n_tokens", session.n_tokens());
    session.reset();
    put("throw.after_text", session.generate(prompt, greedy(n_new)).text);

    // A C-side failure: a bad token id.
    try {
        session.eval({1 << 30});
        put("badtoken.status", "none");
    } catch (const fastllm::Error &e) {
        put("badtoken.status", fastllm_status_name(e.status()));
    }

    // eval returns the logits the mode asks for.
    session.reset();
    const std::vector<float> last = session.eval(ids, FASTLLM_LOGITS_LAST);
    put("eval.n_logits", static_cast<long long>(last.size()));
    put("eval.vocab", model.info().vocab_size);
    session.truncate(1);
    put("truncate.n_tokens", session.n_tokens());

    // Sessions for many NPCs: a fork shares the prefix's KV blocks, a saved state restores the
    // conversation, options reach the C params.
    {
        fastllm::SessionOptions o;
        o.type_k = o.type_v = FASTLLM_KV_F32;
        fastllm::Session persona(model, o);
        persona.eval(ids);
        fastllm::Session npc = persona.fork();
        put("fork.n_tokens", npc.n_tokens());
        put("fork.shared", npc.memory().kv_shared_bytes > 0);
        const std::vector<uint8_t> state = npc.save_state();
        const std::string first = npc.generate(std::vector<int32_t>{}, greedy(n_new)).text;
        fastllm::Session restored(model, o);
        restored.load_state(state);
        put("state.same_text", restored.generate(std::vector<int32_t>{}, greedy(n_new)).text == first);
        try {
            restored.load_state(std::vector<uint8_t>(state.begin(), state.begin() + 100));
            put("state.truncated", "none");
        } catch (const fastllm::Error &e) {
            put("state.truncated", fastllm_status_name(e.status()));
        }
        put("cancel.idle", npc.cancel());
        try {
            persona.fork(1, fastllm::SessionOptions{});  // f16: not the source's types
            put("fork.types", "none");
        } catch (const fastllm::Error &e) {
            put("fork.types", fastllm_status_name(e.status()));
        }
    }

    // A chat template given as text (stories260K has none of its own).
    const std::string chatml =
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
        "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
        "{% endif %}";
    put("chat.text_len", static_cast<long long>(
                             model.apply_chat_template({{"user", "Hi"}}, true, chatml).size()));
    put("chat.own_template", model.chat_template() ? "yes" : "no");

    // A missing file: fastllm::Error with FASTLLM_ERR_IO.
    try {
        fastllm::Model missing(argv[4]);
        put("missing.status", "none");
    } catch (const fastllm::Error &e) {
        put("missing.status", fastllm_status_name(e.status()));
        put("missing.what", e.what());
    }

    // Moved-from handles are empty; the moved-to ones work; each handle is freed once.
    fastllm::Model model2 = std::move(model);
    fastllm::Session session2(std::move(session));
    put("moved.model_empty", !model && model.get() == nullptr);
    put("moved.session_empty", !session && session.get() == nullptr);
    session2.reset();
    put("moved.text", session2.generate(prompt, greedy(n_new)).text);
    fastllm::Session session3;
    session3 = std::move(session2);  // move-assign into an empty handle
    fastllm::Session session4(model2, {64});
    session4 = std::move(session3);  // move-assign over a live handle frees it
    put("moved.assign_ok", static_cast<bool>(session4) && !session3 && session4.n_ctx() == 256);
    try {
        session.reset();  // an empty handle is the C API's NULL: an error, not a crash
        put("empty.status", "none");
    } catch (const fastllm::Error &e) {
        put("empty.status", fastllm_status_name(e.status()));
    }
    put("done", 1);
    return 0;
}
