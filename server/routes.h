// HTTP routes: authentication, body limits, the OpenAI-compatible endpoints (plain and streamed
// as Server-Sent Events), /tokenize, /detokenize, /health and /metrics. Handlers run on
// cpp-httplib's worker threads; generation is handed to the Scheduler.
#pragma once

#include <atomic>
#include <chrono>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include <httplib.h>

#include "engine.h"
#include "metrics.h"
#include "scheduler.h"

namespace fastllm_server {

struct ServerConfig {
    std::string model_name;
    std::string api_key;              // "" = no authentication
    size_t max_body_bytes = 1 << 20;  // larger bodies get 413
    // Speculative decoding: the default of requests that name none ("off", "lookup" or "draft"),
    // the draft model (nullptr: none; "draft" requests then get 400) and the default n_draft.
    std::string speculative = "off";
    const fastllm_model *draft_model = nullptr;
    int n_draft = 5;
    bool generates = true;     // false: an embedding model (an encoder); the generating endpoints get 400
    bool embeddings = false;   // /v1/embeddings served (always for an embedding model; --embeddings)
};

class Routes {
public:
    Routes(Engine &engine, Scheduler &scheduler, Metrics &metrics, ServerConfig config,
           const std::atomic<bool> &stopping);
    // Registers the handlers, the error handler (OpenAI-shaped bodies for httplib's own 4xx) and
    // the logger that counts requests for /metrics.
    void install(httplib::Server &server);
    // Waits until every streamed response has made its last write (at shutdown, between ending the
    // jobs and stopping the server: httplib no longer calls a stream's provider once stopped, so a
    // stream would lose its closing error event). False if some are still open after timeout.
    bool wait_for_streams(std::chrono::milliseconds timeout) const;

private:
    // A route's work: the request, its response, and the request body (read within the limit).
    using Handler = std::function<void(const httplib::Request &, httplib::Response &, const std::string &)>;
    // Wrap a handler: read the body (POST), authenticate, turn ApiError / exceptions into JSON errors.
    httplib::Server::Handler get_route(bool needs_auth, Handler handler);
    httplib::Server::HandlerWithContentReader post_route(Handler handler);
    void run(const httplib::Request &req, httplib::Response &res, bool needs_auth, const std::function<void()> &work);
    bool authorized(const httplib::Request &req) const;

    void health(const httplib::Request &req, httplib::Response &res, const std::string &body);
    void models(const httplib::Request &req, httplib::Response &res, const std::string &body);
    void model(const httplib::Request &req, httplib::Response &res, const std::string &body);
    void metrics(const httplib::Request &req, httplib::Response &res, const std::string &body);
    void tokenize(const httplib::Request &req, httplib::Response &res, const std::string &body);
    void detokenize(const httplib::Request &req, httplib::Response &res, const std::string &body);
    void generate(httplib::Response &res, const std::string &body, Endpoint endpoint);
    void embeddings(const httplib::Request &req, httplib::Response &res, const std::string &body);
    void rerank(const httplib::Request &req, httplib::Response &res, const std::string &body);

    std::vector<int32_t> prompt_tokens(const GenerationRequest &r) const;
    json model_json() const;
    json adapter_json(const NamedAdapter &a) const;

    Engine &engine_;
    Scheduler &scheduler_;
    Metrics &metrics_;
    ServerConfig config_;
    const std::atomic<bool> &stopping_;
    std::time_t started_;
    std::atomic<int> open_streams_{0};
};

// The metrics label of a request path: the route's pattern, or "other".
std::string endpoint_label(const std::string &path);

}  // namespace fastllm_server
