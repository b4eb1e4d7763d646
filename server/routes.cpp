#include "routes.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <thread>

#include "responses.h"

namespace fastllm_server {

namespace {

const char *const kJson = "application/json";

// Polling interval of a stream waiting for text: how soon a vanished client is noticed.
constexpr std::chrono::milliseconds kStreamPoll{50};

void send_error(httplib::Response &res, const ApiError &e) {
    res.status = e.status;
    if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
    res.set_content(dump(error_json(e)), kJson);
}

ApiError make_error(int status, std::string message, std::string type, std::string code) {
    ApiError e;
    e.status = status;
    e.message = std::move(message);
    e.type = std::move(type);
    e.code = std::move(code);
    return e;
}

// A request naming another model than the one served: 404, as OpenAI answers it.
void check_model(const std::string &requested, const std::string &served) {
    if (requested.empty() || requested == served) return;
    ApiError e = make_error(404, "the model '" + requested + "' does not exist; this server serves '" + served + "'",
                            "invalid_request_error", "model_not_found");
    e.param = "model";
    throw e;
}

std::string reason_phrase(int status) {
    switch (status) {
    case 400: return "bad request";
    case 404: return "not found";
    case 408: return "request timeout";
    case 413: return "payload too large";
    case 414: return "URI too long";
    case 416: return "range not satisfiable";
    case 500: return "internal server error";
    default: return "HTTP error " + std::to_string(status);
    }
}

bool equal_constant_time(const std::string &a, const std::string &b) {
    if (a.size() != b.size()) return false;
    unsigned char diff = 0;
    for (size_t i = 0; i < a.size(); i++) diff |= (unsigned char)(a[i] ^ b[i]);
    return diff == 0;
}

uint64_t random_seed() {
    static std::mutex mu;
    static std::mt19937_64 rng(std::random_device{}());
    std::lock_guard<std::mutex> lock(mu);
    return rng();
}

// What a streaming response keeps between the provider's calls. It lives until httplib is done
// with the response (its last write made or the client gone); open counts the streams alive.
struct Stream {
    explicit Stream(std::atomic<int> &open) : open(open) { open++; }
    ~Stream() { open--; }
    Stream(const Stream &) = delete;
    Stream &operator=(const Stream &) = delete;

    std::atomic<int> &open;
    std::shared_ptr<Job> job;
    ResponseMeta meta;
    // With tools (tool_choice not "none"), the reply's text is sent on up to where a call may begin
    // in the template's format; the rest is held and sent at its end, as tool calls or as text.
    const Engine *engine = nullptr;
    json tools;
    std::string held;   // the whole reply so far
    size_t sent = 0;    // bytes of it sent as content
    bool include_usage = false;
    bool started = false;
    bool finished = false;
};

bool write(httplib::DataSink &sink, const std::string &s) { return sink.write(s.data(), s.size()); }

// One call of the chunked content provider: waits a little for text, writes what came, ends the
// stream once the job has. Returns false when the client is gone (the releaser then cancels the job).
bool stream_some(Stream &st, httplib::DataSink &sink) {
    if (!st.started) {
        st.started = true;
        if (st.meta.endpoint == Endpoint::ChatCompletions && !write(sink, sse_event(stream_chunk(st.meta, "", true, {}))))
            return false;
    }
    std::string text;
    const bool finished = st.job->wait(text, kStreamPoll);
    if (st.engine) {
        st.held += text;
        size_t safe = std::max(st.sent, st.engine->tool_text_safe(st.held));
        text = st.held.substr(st.sent, safe - st.sent);
        st.sent = safe;
    }
    if (!text.empty() && !write(sink, sse_event(stream_chunk(st.meta, text, false, {})))) return false;
    if (!finished) return !text.empty() || sink.is_writable();
    st.finished = true;
    const JobResult r = st.job->result();
    bool ok;
    if (r.reason == FinishReason::Stop || r.reason == FinishReason::Length) {
        std::string finish = finish_reason_name(r.reason);
        ok = true;
        if (st.engine) {
            json parsed = st.engine->parse_tool_calls(st.held, st.tools);
            const json &calls = parsed["tool_calls"];
            // the text not yet sent: all of the rest without calls; with calls, what was held goes
            // (the text between and after calls is rare; it is the calls' content in the unstreamed answer)
            std::string rest;
            if (calls.empty()) rest = st.held.substr(st.sent);
            else if (st.sent == 0) rest = parsed["content"].get<std::string>();
            if (!rest.empty()) ok = write(sink, sse_event(stream_chunk(st.meta, rest, false, {})));
            if (ok && !calls.empty()) {
                ok = write(sink, sse_event(tool_calls_chunk(st.meta, tool_calls_json(calls, true))));
                finish = "tool_calls";
            }
        }
        if (ok) ok = write(sink, sse_event(stream_chunk(st.meta, "", false, finish, &r.timings)));
        if (ok && st.include_usage) ok = write(sink, sse_event(usage_chunk(st.meta, r)));
    } else {
        ApiError e = r.reason == FinishReason::Error
                         ? r.error
                         : make_error(503, "the server is shutting down; the generation was stopped", "server_error",
                                      "shutting_down");
        ok = write(sink, sse_event(error_json(e)));
    }
    if (ok) ok = write(sink, kSseDone);
    if (ok) sink.done();
    return ok;
}

}  // namespace

std::string endpoint_label(const std::string &path) {
    static const char *const known[] = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
                                        "/metrics",        "/tokenize",            "/detokenize", "/v1/embeddings",
                                        "/v1/rerank",      "/rerank"};
    for (const char *k : known)
        if (path == k) return k;
    if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{model}";
    return "other";
}

Routes::Routes(Engine &engine, Scheduler &scheduler, Metrics &metrics, ServerConfig config,
               const std::atomic<bool> &stopping)
    : engine_(engine), scheduler_(scheduler), metrics_(metrics), config_(std::move(config)), stopping_(stopping),
      started_(std::time(nullptr)) {}

bool Routes::wait_for_streams(std::chrono::milliseconds timeout) const {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (open_streams_.load() > 0) {
        if (std::chrono::steady_clock::now() >= until) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
}

void Routes::install(httplib::Server &svr) {
    using namespace std::placeholders;
    svr.set_payload_max_length(config_.max_body_bytes);
    auto bind = [this](void (Routes::*fn)(const httplib::Request &, httplib::Response &, const std::string &)) {
        return [this, fn](const httplib::Request &q, httplib::Response &s, const std::string &b) { (this->*fn)(q, s, b); };
    };
    svr.Get("/health", get_route(false, bind(&Routes::health)));
    svr.Get("/v1/models", get_route(true, bind(&Routes::models)));
    svr.Get(R"(/v1/models/(.+))", get_route(true, bind(&Routes::model)));
    svr.Get("/metrics", get_route(true, bind(&Routes::metrics)));
    svr.Post("/tokenize", post_route(bind(&Routes::tokenize)));
    svr.Post("/detokenize", post_route(bind(&Routes::detokenize)));
    svr.Post("/v1/embeddings", post_route(bind(&Routes::embeddings)));
    svr.Post("/v1/rerank", post_route(bind(&Routes::rerank)));
    svr.Post("/rerank", post_route(bind(&Routes::rerank)));
    svr.Post("/v1/completions", post_route([this](const httplib::Request &, httplib::Response &s, const std::string &b) {
                 generate(s, b, Endpoint::Completions);
             }));
    svr.Post("/v1/chat/completions",
             post_route([this](const httplib::Request &, httplib::Response &s, const std::string &b) {
                 generate(s, b, Endpoint::ChatCompletions);
             }));

    // httplib's own errors (no route, body too large, malformed HTTP) get an OpenAI-shaped body too.
    const size_t limit = config_.max_body_bytes;
    svr.set_error_handler(httplib::Server::HandlerWithResponse([limit](const httplib::Request &req, httplib::Response &res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // a handler's own error
        ApiError e = make_error(res.status, reason_phrase(res.status), "invalid_request_error", "");
        if (res.status == 404) {
            const std::string label = endpoint_label(req.path);
            if (label != "other") {
                e = make_error(405, "method " + req.method + " is not allowed on " + req.path, "invalid_request_error",
                               "method_not_allowed");
            } else {
                e.message = "no such endpoint: " + req.method + " " + req.path;
                e.code = "not_found";
            }
        } else if (res.status == 413) {
            e.message = "the request body exceeds the limit of " + std::to_string(limit) + " bytes";
            e.code = "request_too_large";
        } else if (res.status >= 500) {
            e.type = "server_error";
        }
        send_error(res, e);
        return httplib::Server::HandlerResponse::Handled;
    }));
    svr.set_logger([this](const httplib::Request &req, const httplib::Response &res) {
        metrics_.count_request(endpoint_label(req.path), res.status);
    });
}

void Routes::run(const httplib::Request &req, httplib::Response &res, bool needs_auth,
                 const std::function<void()> &work) {
    try {
        if (needs_auth && !authorized(req))
            throw make_error(401, "a valid API key is required: send the header 'Authorization: Bearer <key>'",
                             "authentication_error", "invalid_api_key");
        work();
    } catch (const ApiError &e) {
        send_error(res, e);
    } catch (const std::exception &e) {
        send_error(res, make_error(500, std::string("internal error: ") + e.what(), "server_error", ""));
    }
}

httplib::Server::Handler Routes::get_route(bool needs_auth, Handler handler) {
    return [this, needs_auth, handler](const httplib::Request &req, httplib::Response &res) {
        run(req, res, needs_auth, [&] { handler(req, res, req.body); });
    };
}

// POST bodies are read here rather than by httplib, whose own reading caps form-encoded bodies
// (curl -d without a Content-Type) at 8 KiB, and lets a chunked body grow without limit.
httplib::Server::HandlerWithContentReader Routes::post_route(Handler handler) {
    return [this, handler](const httplib::Request &req, httplib::Response &res,
                           const httplib::ContentReader &reader) {
        run(req, res, false, [&] {
            if (req.is_multipart_form_data())
                throw make_error(415, "multipart bodies are not accepted: send JSON", "invalid_request_error",
                                 "unsupported_media_type");
            std::string body;
            bool too_large = false;
            const size_t limit = config_.max_body_bytes;
            bool ok = reader([&](const char *data, size_t n) {
                if (body.size() + n > limit) {
                    too_large = true;
                    return false;
                }
                body.append(data, n);
                return true;
            });
            if (too_large || res.status == 413)
                throw make_error(413, "the request body exceeds the limit of " + std::to_string(limit) + " bytes",
                                 "invalid_request_error", "request_too_large");
            if (!ok) throw bad_request("the request body could not be read");
            run(req, res, true, [&] { handler(req, res, body); });
        });
    };
}

bool Routes::authorized(const httplib::Request &req) const {
    if (config_.api_key.empty()) return true;
    return equal_constant_time(req.get_header_value("Authorization"), "Bearer " + config_.api_key);
}

json Routes::model_json() const {
    const fastllm_model_info &info = engine_.info();
    return json{{"id", config_.model_name},
                {"object", "model"},
                {"created", (int64_t)started_},
                {"owned_by", "fastllm"},
                {"meta",
                 {{"architecture", info.architecture ? info.architecture : ""},
                  {"n_ctx", scheduler_.n_ctx()},
                  {"context_length", info.context_length},
                  {"vocab_size", info.vocab_size},
                  {"n_params", info.n_params},
                  {"weight_dtype", info.weight_dtype ? info.weight_dtype : ""},
                  {"chat_template", engine_.has_chat_template()}}}};
}

void Routes::health(const httplib::Request &, httplib::Response &res, const std::string &) {
    if (stopping_) {
        res.status = 503;
        res.set_content(dump(json{{"status", "shutting down"}}), kJson);
        return;
    }
    json body{{"status", "ok"},
              {"sessions", {{"active", scheduler_.active()}, {"max", scheduler_.max_sessions()}}},
              {"queue", {{"waiting", scheduler_.queue_depth()}, {"max", scheduler_.max_queue()}}}};
    res.set_content(dump(body), kJson);
}

// A LoRA adapter as a model of its own, as vLLM lists them: "parent" is the base model.
json Routes::adapter_json(const NamedAdapter &a) const {
    return json{{"id", a.name},
                {"object", "model"},
                {"created", (int64_t)started_},
                {"owned_by", "fastllm"},
                {"parent", config_.model_name},
                {"root", config_.model_name},
                {"meta", {{"lora", {{"scale", a.scale}}}}}};  // not its path: a client need not know the server's files
}

void Routes::models(const httplib::Request &, httplib::Response &res, const std::string &) {
    json data = json::array({model_json()});
    for (const auto &a : engine_.adapters()) data.push_back(adapter_json(a));
    res.set_content(dump(json{{"object", "list"}, {"data", std::move(data)}}), kJson);
}

void Routes::model(const httplib::Request &req, httplib::Response &res, const std::string &) {
    const std::string id = req.matches[1];
    if (const NamedAdapter *a = engine_.find_adapter(id)) return res.set_content(dump(adapter_json(*a)), kJson);
    if (id != config_.model_name)
        throw make_error(404, "the model '" + id + "' does not exist; this server serves '" + config_.model_name + "'",
                         "invalid_request_error", "model_not_found");
    res.set_content(dump(model_json()), kJson);
}

void Routes::metrics(const httplib::Request &, httplib::Response &res, const std::string &) {
    Metrics::Gauges g;
    g.queue_depth = scheduler_.queue_depth();
    g.active_sessions = scheduler_.active();
    g.max_sessions = (size_t)scheduler_.max_sessions();
    g.max_queue = (size_t)scheduler_.max_queue();
    res.set_content(metrics_.render(g), "text/plain; version=0.0.4; charset=utf-8");
}

void Routes::tokenize(const httplib::Request &, httplib::Response &res, const std::string &body) {
    TokenizeRequest r = parse_tokenize_request(parse_body(body));
    res.set_content(dump(json{{"tokens", engine_.tokenize(r.content, r.add_special ? 1 : 0)}}), kJson);
}

void Routes::detokenize(const httplib::Request &, httplib::Response &res, const std::string &body) {
    std::vector<int32_t> tokens = parse_detokenize_request(parse_body(body));
    engine_.check_tokens(tokens, "tokens");
    res.set_content(dump(json{{"content", engine_.detokenize(tokens)}}), kJson);
}

std::vector<int32_t> Routes::prompt_tokens(const GenerationRequest &r) const {
    if (r.endpoint == Endpoint::ChatCompletions)
        return engine_.tokenize(engine_.apply_chat_template(r), 0);  // templates carry BOS as text
    if (r.prompt_is_tokens) {
        engine_.check_tokens(r.prompt_tokens, "prompt");
        return r.prompt_tokens;
    }
    return engine_.tokenize(r.prompt, -1);  // the model's BOS default, as fastllm's generate
}

namespace {
std::string base64(const unsigned char *p, size_t n) {
    static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    out.reserve((n + 2) / 3 * 4);
    for (size_t i = 0; i < n; i += 3) {
        const uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        out += kAlphabet[v >> 18 & 63];
        out += kAlphabet[v >> 12 & 63];
        out += i + 1 < n ? kAlphabet[v >> 6 & 63] : '=';
        out += i + 2 < n ? kAlphabet[v & 63] : '=';
    }
    return out;
}
}  // namespace

// OpenAI's embeddings: input a string, a list of strings, a token list or a list of token lists;
// encoding_format float (default) or base64 (the float32 bytes, little-endian); usage counts the
// tokens. An input past the model's context is a 400, as OpenAI answers it.
void Routes::embeddings(const httplib::Request &, httplib::Response &res, const std::string &text) {
    if (!config_.embeddings)
        throw bad_request("this server does not serve embeddings: start it with --embeddings (or serve an embedding "
                          "model)", "", "embeddings_disabled");
    const json body = parse_body(text);
    if (body.contains("model") && !body["model"].is_null()) {
        if (!body["model"].is_string()) throw bad_request("'model' must be a string", "model");
        check_model(body["model"].get<std::string>(), config_.model_name);
    }
    const std::string format = body.value("encoding_format", json("float")).is_string()
                                   ? body.value("encoding_format", std::string("float")) : std::string("?");
    if (format != "float" && format != "base64")
        throw bad_request("'encoding_format' must be 'float' or 'base64'", "encoding_format", "invalid_value");
    const fastllm_model_info &info = engine_.info();
    if (body.contains("dimensions") && !body["dimensions"].is_null() &&
        !(body["dimensions"].is_number_integer() && body["dimensions"].get<int64_t>() == info.hidden_size))
        throw bad_request("'dimensions' must be the model's " + std::to_string(info.hidden_size) + " (it cannot be changed)",
                          "dimensions", "invalid_value");
    if (!body.contains("input")) throw bad_request("'input' is required", "input");
    const json &in = body["input"];
    // Texts, or token lists: a list of integers is one input, a list of lists is many.
    std::vector<std::string> texts;
    std::vector<std::vector<int32_t>> lists;
    auto token_list = [&](const json &j, const std::string &where) {
        std::vector<int32_t> ids;
        for (const json &t : j) {
            if (!t.is_number_integer()) throw bad_request("'" + where + "' must hold token ids (integers)", "input");
            const int64_t v = t.get<int64_t>();
            if (v < 0 || v >= info.vocab_size)
                throw bad_request("'" + where + "' holds the token " + std::to_string(v) + ", outside the vocabulary of " +
                                  std::to_string(info.vocab_size), "input");
            ids.push_back((int32_t)v);
        }
        if (ids.empty()) throw bad_request("'" + where + "' is an empty token list", "input");
        return ids;
    };
    if (in.is_string()) {
        texts.push_back(in.get<std::string>());
    } else if (in.is_array() && !in.empty() && in[0].is_number_integer()) {
        lists.push_back(token_list(in, "input"));
    } else if (in.is_array() && !in.empty()) {
        for (size_t i = 0; i < in.size(); i++) {
            const std::string where = "input[" + std::to_string(i) + "]";
            if (in[i].is_string()) texts.push_back(in[i].get<std::string>());
            else if (in[i].is_array()) lists.push_back(token_list(in[i], where));
            else throw bad_request("'" + where + "' must be a string or a token list", "input");
        }
        if (!texts.empty() && !lists.empty()) throw bad_request("'input' mixes texts and token lists", "input");
    } else {
        throw bad_request(in.is_array() ? "'input' is an empty list" : "'input' must be a string, a list of strings or token lists",
                          "input");
    }
    for (size_t i = 0; i < texts.size(); i++) {
        if (texts[i].find('\0') != std::string::npos) throw bad_request("'input' must not contain NUL characters", "input");
        if (texts[i].empty()) throw bad_request("'input[" + std::to_string(i) + "]' is an empty string", "input");
    }
    // The token counts (usage), and the inputs past the context.
    size_t n_tokens = 0;
    const size_t n = texts.empty() ? lists.size() : texts.size();
    for (size_t i = 0; i < n; i++) {
        const size_t len = texts.empty() ? lists[i].size() : engine_.tokenize(texts[i], -1).size();
        if (len > (size_t)info.context_length)
            throw bad_request("input " + std::to_string(i) + " has " + std::to_string(len) + " tokens, more than the model's " +
                              std::to_string(info.context_length), "input", "context_length_exceeded");
        n_tokens += len;
    }
    fastllm_embed_params p = fastllm_embed_default_params();
    p.truncate = 0;
    {  // OpenAI's shape is one vector per input: a model that pools none has one per token
        size_t count = 0;
        const char *probe = "a";
        fastllm_embed(engine_.model(), &probe, 1, &p, nullptr, 0, &count);
        if (count != 1)
            throw bad_request("this model gives one vector per token (its pooling is none), which /v1/embeddings cannot "
                              "return", "", "pooling_none");
    }
    std::vector<float> out(n * (size_t)info.hidden_size);
    size_t n_vectors = 0;
    fastllm_status st;
    if (texts.empty()) {
        std::vector<const int32_t *> ptrs;
        std::vector<size_t> lens;
        for (const auto &l : lists) ptrs.push_back(l.data()), lens.push_back(l.size());
        st = fastllm_embed_tokens(engine_.model(), ptrs.data(), lens.data(), n, &p, out.data(), out.size(), &n_vectors);
    } else {
        std::vector<const char *> ptrs;
        for (const auto &t : texts) ptrs.push_back(t.c_str());
        st = fastllm_embed(engine_.model(), ptrs.data(), n, &p, out.data(), out.size(), &n_vectors);
    }
    if (st != FASTLLM_OK) {
        const bool client = st == FASTLLM_ERR_INVALID_ARGUMENT || st == FASTLLM_ERR_CONTEXT_FULL || st == FASTLLM_ERR_TOKEN_OUT_OF_RANGE;
        throw make_error(client ? 400 : 500, fastllm_last_error(), client ? "invalid_request_error" : "server_error", "");
    }
    json data = json::array();
    const size_t H = (size_t)info.hidden_size;
    for (size_t i = 0; i < n; i++) {
        json e{{"object", "embedding"}, {"index", i}};
        if (format == "base64") e["embedding"] = base64((const unsigned char *)&out[i * H], H * sizeof(float));
        else e["embedding"] = std::vector<float>(out.begin() + i * H, out.begin() + (i + 1) * H);
        data.push_back(std::move(e));
    }
    res.set_content(dump(json{{"object", "list"}, {"data", std::move(data)}, {"model", config_.model_name},
                              {"usage", {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}}}}),
                    kJson);
}

// Reranking in the shape Jina and Cohere define and llama.cpp serves: a query and documents
// (strings, or objects with "text"); results sorted by relevance_score (highest first), top_n of
// them, each with its document's index (and the document, with return_documents).
void Routes::rerank(const httplib::Request &, httplib::Response &res, const std::string &text) {
    const json body = parse_body(text);
    if (body.contains("model") && body["model"].is_string()) check_model(body["model"].get<std::string>(), config_.model_name);
    if (!body.contains("query") || !body["query"].is_string()) throw bad_request("'query' must be a string", "query");
    const std::string query = body["query"].get<std::string>();
    if (!body.contains("documents") || !body["documents"].is_array() || body["documents"].empty())
        throw bad_request("'documents' must be a non-empty list", "documents");
    std::vector<std::string> docs;
    for (const json &d : body["documents"]) {
        if (d.is_string()) docs.push_back(d.get<std::string>());
        else if (d.is_object() && d.contains("text") && d["text"].is_string()) docs.push_back(d["text"].get<std::string>());
        else throw bad_request("each of 'documents' must be a string or an object with a string 'text'", "documents");
    }
    for (const std::string &t : docs)
        if (t.find('\0') != std::string::npos || query.find('\0') != std::string::npos)
            throw bad_request("'query' and 'documents' must not contain NUL characters", "documents");
    size_t top_n = docs.size();
    if (body.contains("top_n") && !body["top_n"].is_null()) {
        if (!body["top_n"].is_number_integer() || body["top_n"].get<int64_t>() < 1)
            throw bad_request("'top_n' must be a positive integer", "top_n");
        top_n = std::min(top_n, (size_t)body["top_n"].get<int64_t>());
    }
    if (body.contains("return_documents") && !body["return_documents"].is_boolean())
        throw bad_request("'return_documents' must be true or false", "return_documents");
    const bool return_documents = body.value("return_documents", false);
    std::vector<const char *> ptrs;
    for (const auto &d : docs) ptrs.push_back(d.c_str());
    std::vector<float> scores(docs.size());
    fastllm_rerank_params p = fastllm_rerank_default_params();
    const fastllm_status st = fastllm_rerank(engine_.model(), query.c_str(), ptrs.data(), docs.size(), &p, scores.data());
    if (st != FASTLLM_OK) {
        const bool client = st == FASTLLM_ERR_INVALID_ARGUMENT || st == FASTLLM_ERR_CONTEXT_FULL || st == FASTLLM_ERR_UNSUPPORTED;
        throw make_error(client ? 400 : 500, fastllm_last_error(), client ? "invalid_request_error" : "server_error",
                         st == FASTLLM_ERR_UNSUPPORTED ? "model_cannot_rerank" : "");
    }
    // usage: the tokens of every pair as the model ran it ([CLS] query [SEP] document [SEP], cut to the context)
    const size_t q = engine_.tokenize(query, 0).size(), ctx = (size_t)engine_.info().context_length;
    size_t n_tokens = 0;
    for (const auto &d : docs) n_tokens += std::min(ctx, q + engine_.tokenize(d, 0).size() + 3);
    std::vector<size_t> order(docs.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = i;
    auto key = [&](size_t i) { return std::isnan(scores[i]) ? -INFINITY : scores[i]; };  // a strict weak order
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) > key(b); });
    json results = json::array();
    for (size_t k = 0; k < top_n; k++) {
        json r{{"index", order[k]}, {"relevance_score", scores[order[k]]}};
        if (return_documents) r["document"] = json{{"text", docs[order[k]]}};
        results.push_back(std::move(r));
    }
    res.set_content(dump(json{{"object", "list"}, {"model", config_.model_name}, {"results", std::move(results)},
                              {"usage", {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}}}}),
                    kJson);
}

void Routes::generate(httplib::Response &res, const std::string &text, Endpoint endpoint) {
    if (!config_.generates)
        throw bad_request("the model '" + config_.model_name + "' is an embedding model: it does not generate; use "
                          "/v1/embeddings", "", "model_cannot_generate");
    const json body = parse_body(text);
    GenerationRequest r =
        endpoint == Endpoint::Completions ? parse_completion_request(body) : parse_chat_request(body);
    // A request may name a LoRA adapter as its model (vLLM's way): the replies name it too.
    const bool names_adapter = !r.model.empty() && engine_.find_adapter(r.model);
    if (!names_adapter) check_model(r.model, config_.model_name);
    AdapterSet adapters = engine_.adapter_set(r);
    Constraint constraint = engine_.constraint_of(r);  // a bad schema or grammar is answered before any work
    const char *prompt_param = endpoint == Endpoint::Completions ? "prompt" : "messages";
    std::vector<int32_t> prompt = prompt_tokens(r);
    if (prompt.empty()) throw bad_request("the prompt is empty (it has no tokens)", prompt_param);
    const int64_t n_ctx = scheduler_.n_ctx();
    if ((int64_t)prompt.size() >= n_ctx)
        throw bad_request("the prompt has " + std::to_string(prompt.size()) + " tokens, but the context holds " +
                              std::to_string(n_ctx) + " and at least one must remain for the completion",
                          prompt_param, "context_length_exceeded");

    fastllm_sampling_params p = fastllm_sampling_default_params();
    // OpenAI's default for completions is 16 tokens; a chat reply may fill the context.
    int64_t max_tokens = r.max_tokens ? *r.max_tokens : (endpoint == Endpoint::Completions ? 16 : n_ctx);
    p.max_new_tokens = (int32_t)std::min<int64_t>(max_tokens, std::numeric_limits<int32_t>::max());
    p.temperature = r.temperature;
    p.top_k = r.top_k;
    p.top_p = r.top_p;
    p.min_p = r.min_p;
    p.repetition_penalty = r.repetition_penalty;
    p.seed = r.seed ? *r.seed : random_seed();
    p.ignore_eos = r.ignore_eos ? 1 : 0;
    auto job = std::make_shared<Job>(std::move(prompt), p, std::move(r.stop), std::move(constraint));
    job->set_adapters(std::move(adapters));
    const std::string mode = r.speculative.empty() ? config_.speculative : r.speculative;
    if (mode == "draft" && !config_.draft_model)
        throw bad_request("'speculative': \"draft\" needs a server started with --draft-model", "speculative",
                          "invalid_value");
    if (mode != "off") {
        fastllm_speculative_params sp = fastllm_speculative_default_params();
        sp.draft_model = mode == "draft" ? config_.draft_model : nullptr;
        sp.n_draft = r.n_draft ? *r.n_draft : config_.n_draft;
        job->set_speculative(sp);
    }

    switch (scheduler_.submit(job)) {
    case Scheduler::Admission::Accepted: break;
    case Scheduler::Admission::QueueFull:
        throw make_error(503,
                         "the server is busy: all " + std::to_string(scheduler_.max_sessions()) + " sessions are in use and " +
                             std::to_string(scheduler_.max_queue()) + " requests are waiting; retry later",
                         "server_error", "server_busy");
    case Scheduler::Admission::ShuttingDown:
        throw make_error(503, "the server is shutting down", "server_error", "shutting_down");
    }

    ResponseMeta meta = make_meta(endpoint, names_adapter ? r.model : config_.model_name);
    if (!r.stream) {
        std::string text;
        while (!job->wait(text, std::chrono::seconds(1))) {
        }
        JobResult result = job->result();
        if (result.reason == FinishReason::Error) throw result.error;
        if (result.reason != FinishReason::Stop && result.reason != FinishReason::Length)
            throw make_error(503, "the server is shutting down; the generation was stopped", "server_error",
                             "shutting_down");
        json calls = json::array();
        if (!r.tools.empty() && r.tool_choice != "none") {
            json parsed = engine_.parse_tool_calls(text, r.tools);
            if (!parsed["tool_calls"].empty()) {
                calls = tool_calls_json(parsed["tool_calls"], false);
                text = parsed["content"].get<std::string>();
            }
        }
        res.set_content(dump(completion_body(meta, text, result, calls)), kJson);
        return;
    }
    auto st = std::make_shared<Stream>(open_streams_);
    st->job = job;
    st->meta = meta;
    st->include_usage = r.include_usage;
    if (!r.tools.empty() && r.tool_choice != "none") {
        st->engine = &engine_;
        st->tools = r.tools;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    Scheduler &scheduler = scheduler_;
    res.set_chunked_content_provider(
        "text/event-stream", [st](size_t, httplib::DataSink &sink) { return stream_some(*st, sink); },
        [st, &scheduler](bool) {
            if (!st->finished) scheduler.cancel(st->job);  // the client went away mid-stream
        });
}

}  // namespace fastllm_server
