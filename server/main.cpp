// fastllm-server: an OpenAI-compatible HTTP server over libfastllm's C API.
//
//   fastllm-server MODEL.flm [--host 127.0.0.1] [--port 8080] [--threads N] [--max-sessions N]
//                  [--max-queue N] [--n-ctx N] [--api-key KEY] [--model-name NAME]
//                  [--draft-model PATH] [--speculative off|lookup|draft] [--n-draft N] [--prefill-chunk N]
//                  [--lora NAME=ADAPTER.flm[:SCALE]]... [--parent-pid PID]
//
// main wires the pieces together: the model (engine), the batching scheduler, the HTTP routes,
// and the signal handling for a graceful shutdown on SIGINT / SIGTERM.
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "engine.h"
#include "metrics.h"
#include "routes.h"
#include "scheduler.h"

namespace {

// SIGINT/SIGTERM handler: wakes main through a pipe. (Blocking the signals and sigwait-ing for them
// is not enough: threads that libraries start before main do not block them.)
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
    const char c = (char)sig;
    ssize_t r = write(g_signal_pipe[1], &c, 1);
    (void)r;
}

// What wakes main when --parent-pid's process has ended (no signal has this number).
constexpr int kParentEnded = -1;

// --parent-pid: polls, on one thread, whether the parent is still the one given. A process whose
// parent ends gets a new one (init or a subreaper), so getppid is all it takes, on every POSIX
// system. The supervisor cannot ask the kernel for a death signal itself: that takes code between
// fork and exec (Python's preexec_fn), and forking a process that runs gRPC (a Ray worker) without
// exec-ing at once can abort the child in gRPC's fork handlers.
void watch_parent(long parent_pid) {
    std::thread([parent_pid] {
        while (getppid() == (pid_t)parent_pid) std::this_thread::sleep_for(std::chrono::milliseconds(200));
        on_signal(kParentEnded);
    }).detach();
}

const char *const kUsage =
    "usage: fastllm-server MODEL.flm [options]\n"
    "\n"
    "An OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /v1/models, /health,\n"
    "/v1/embeddings, /tokenize, /detokenize, /metrics) with continuous batching over libfastllm.\n"
    "\n"
    "options:\n"
    "  --host HOST          address to bind (default 127.0.0.1)\n"
    "  --port N             port (default 8080; 0 = any free port, printed at start)\n"
    "  --threads N          compute threads (default 0 = all cores)\n"
    "  --device D           what runs the model: cpu (default), vulkan, vulkan:N or auto (docs/gpu.md)\n"
    "  --gpu-layers N       layers on the device (default -1 = all; 0 = none)\n"
    "  --max-sessions N     sessions decoding together (default 4)\n"
    "  --max-queue N        requests that may wait for a session; more get 503 (default 64)\n"
    "  --n-ctx N            context length of each session (default 0 = 4096, or the model's if shorter)\n"
    "  --api-key KEY        demand 'Authorization: Bearer KEY' (also $FASTLLM_API_KEY); /health is exempt\n"
    "  --model-name NAME    the model id clients use (default: the file name without .flm)\n"
    "  --max-body-bytes N   largest request body (default 1048576); larger ones get 413\n"
    "  --draft-model PATH   a smaller model of the same vocabulary drafting for speculative decoding\n"
    "  --speculative MODE   requests' default: off, lookup (prompt lookup) or draft (default: draft\n"
    "                       with --draft-model, else off); a request's \"speculative\" field overrides it\n"
    "  --n-draft N          most tokens drafted a step (1 to 16, default 5; a request's \"n_draft\")\n"
    "  --prefill-chunk N    new requests' prompt tokens evaluated a step, in the same pass as the running\n"
    "                       requests' next tokens (default 256); 0 = each prompt whole, on admission\n"
    "  --lora NAME=PATH[:SCALE]  load a LoRA adapter (convert.py --adapter; docs/lora.md) that requests\n"
    "                       apply by naming it as their \"model\" or in \"lora\": [{\"name\", \"scale\"}];\n"
    "                       SCALE (default 1) is their scale when they give none. Repeatable; a request\n"
    "                       that names no adapter gets the base model\n"
    "  --embeddings         also serve /v1/embeddings with a generating model (an embedding model,\n"
    "                       such as a BERT, serves only it)\n"
    "  -h, --help           this text\n";

struct Options {
    std::string model_path;
    std::string host = "127.0.0.1";
    int port = 8080;
    int threads = 0;
    std::string device;
    int gpu_layers = -1;
    int max_sessions = 4;
    int max_queue = 64;
    int n_ctx = 0;
    std::string api_key;
    std::string model_name;
    size_t max_body_bytes = 1 << 20;
    std::string draft_model_path;
    std::string speculative;  // "" = draft with a draft model, else off
    int n_draft = 5;
    int prefill_chunk = 256;
    bool embeddings = false;
    long parent_pid = 0;
    struct Lora {
        std::string name, path;
        float scale = 1.0f;
    };
    std::vector<Lora> lora;
};

[[noreturn]] void usage_error(const std::string &message) {
    std::fprintf(stderr, "fastllm-server: %s\n\n%s", message.c_str(), kUsage);
    std::exit(2);
}

long parse_int(const std::string &flag, const char *value, long lo, long hi) {
    char *end = nullptr;
    errno = 0;
    long v = std::strtol(value, &end, 10);
    if (errno || end == value || *end || v < lo || v > hi)
        usage_error(flag + " needs an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], not '" +
                    value + "'");
    return v;
}

// --lora NAME=PATH[:SCALE] (or PATH[:SCALE], named after the file)
Options::Lora parse_lora(const std::string &spec) {
    Options::Lora l;
    std::string rest = spec;
    const size_t eq = spec.find('=');
    if (eq != std::string::npos) l.name = spec.substr(0, eq), rest = spec.substr(eq + 1);
    const size_t colon = rest.rfind(':');
    if (colon != std::string::npos) {
        const std::string s = rest.substr(colon + 1);
        char *end = nullptr;
        errno = 0;
        const float v = std::strtof(s.c_str(), &end);
        if (!s.empty() && !errno && *end == '\0') {
            if (!std::isfinite(v)) usage_error("--lora " + spec + ": the scale must be finite");
            l.scale = v, rest.resize(colon);
        }
    }
    l.path = rest;
    if (l.name.empty() && eq == std::string::npos) {
        l.name = rest.substr(rest.find_last_of('/') + 1);
        if (l.name.size() > 4 && l.name.compare(l.name.size() - 4, 4, ".flm") == 0) l.name.resize(l.name.size() - 4);
    }
    if (l.name.empty() || l.path.empty()) usage_error("--lora needs NAME=PATH[:SCALE], not '" + spec + "'");
    return l;
}

Options parse_options(int argc, char **argv) {
    Options o;
    if (const char *key = std::getenv("FASTLLM_API_KEY")) o.api_key = key;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            std::exit(0);
        }
        if (a == "--embeddings") {
            o.embeddings = true;
            continue;
        }
        if (a.rfind("--", 0) != 0) {
            if (!o.model_path.empty()) usage_error("more than one model given ('" + o.model_path + "', '" + a + "')");
            o.model_path = a;
            continue;
        }
        std::string value;
        size_t eq = a.find('=');
        if (eq != std::string::npos) {
            value = a.substr(eq + 1);
            a = a.substr(0, eq);
        } else {
            if (i + 1 >= argc) usage_error(a + " needs a value");
            value = argv[++i];
        }
        const char *v = value.c_str();
        if (a == "--host") o.host = value;
        else if (a == "--port") o.port = (int)parse_int(a, v, 0, 65535);
        else if (a == "--threads") o.threads = (int)parse_int(a, v, 0, 1024);
        else if (a == "--device") o.device = value;
        else if (a == "--gpu-layers") o.gpu_layers = (int)parse_int(a, v, -1, 1 << 20);
        else if (a == "--max-sessions") o.max_sessions = (int)parse_int(a, v, 1, 1024);
        else if (a == "--max-queue") o.max_queue = (int)parse_int(a, v, 0, 100000);
        else if (a == "--n-ctx") o.n_ctx = (int)parse_int(a, v, 0, 1 << 24);
        else if (a == "--api-key") o.api_key = value;
        else if (a == "--model-name") o.model_name = value;
        else if (a == "--max-body-bytes") o.max_body_bytes = (size_t)parse_int(a, v, 1024, 1L << 30);
        else if (a == "--draft-model") o.draft_model_path = value;
        else if (a == "--speculative") {
            if (value != "off" && value != "lookup" && value != "draft")
                usage_error("--speculative needs off, lookup or draft, not '" + value + "'");
            o.speculative = value;
        }
        else if (a == "--n-draft") o.n_draft = (int)parse_int(a, v, 1, 16);
        else if (a == "--prefill-chunk") o.prefill_chunk = (int)parse_int(a, v, 0, 1 << 20);
        else if (a == "--lora") o.lora.push_back(parse_lora(value));
        else if (a == "--parent-pid") o.parent_pid = parse_int(a, v, 1, 1L << 30);
        else usage_error("unknown option " + a);
    }
    if (o.model_path.empty()) usage_error("no model given");
    if (o.speculative.empty()) o.speculative = o.draft_model_path.empty() ? "off" : "draft";
    if (o.speculative == "draft" && o.draft_model_path.empty()) usage_error("--speculative draft needs --draft-model");
    if (o.model_name.empty()) {
        std::string base = o.model_path.substr(o.model_path.find_last_of('/') + 1);
        if (base.size() > 4 && base.compare(base.size() - 4, 4, ".flm") == 0) base.resize(base.size() - 4);
        o.model_name = base;
    }
    return o;
}

}  // namespace

int main(int argc, char **argv) {
    using namespace fastllm_server;
    Options opt = parse_options(argc, argv);

    if (pipe(g_signal_pipe) != 0) {
        std::perror("fastllm-server: pipe");
        return 1;
    }
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);  // a client that went away is noticed by a failed write instead
    if (opt.parent_pid) watch_parent(opt.parent_pid);

    std::string error;
    std::unique_ptr<Engine> engine = Engine::load(opt.model_path, opt.threads, opt.device, opt.gpu_layers, error);
    if (!engine) {
        std::fprintf(stderr, "fastllm-server: cannot load %s: %s\n", opt.model_path.c_str(), error.c_str());
        return 1;
    }
    // An embedding model (an encoder) cannot have sessions: it serves /v1/embeddings alone.
    bool generates = true;
    {
        fastllm_session *probe = nullptr;
        if (fastllm_session_create(engine->model(), nullptr, &probe) == FASTLLM_ERR_UNSUPPORTED) generates = false;
        fastllm_session_free(probe);
    }
    if (!generates && !opt.draft_model_path.empty()) {
        std::fprintf(stderr, "fastllm-server: %s is an embedding model: it cannot have a draft model\n", opt.model_path.c_str());
        return 1;
    }
    if (!generates && !opt.lora.empty()) {
        std::fprintf(stderr, "fastllm-server: %s is an embedding model: LoRA adapters apply to generation\n",
                     opt.model_path.c_str());
        return 1;
    }
    // Adapters, each checked against the model and tried on a session (a model on a device declines them).
    if (!opt.lora.empty()) {
        fastllm_session *probe = nullptr;
        if (fastllm_session_create(engine->model(), nullptr, &probe) != FASTLLM_OK) {
            std::fprintf(stderr, "fastllm-server: cannot create a session: %s\n", fastllm_last_error());
            return 1;
        }
        for (const auto &l : opt.lora) {
            if (l.name == opt.model_name)
                error = "the model itself is named '" + l.name + "'";
            else if (engine->load_adapter(l.name, l.path, l.scale, error) &&  // else error says why
                     fastllm_session_set_adapters(probe, (const fastllm_adapter *const *)&engine->adapters().back().adapter,
                                                  &l.scale, 1) != FASTLLM_OK)
                error = fastllm_last_error();
            if (!error.empty()) {
                fastllm_session_free(probe);
                std::fprintf(stderr, "fastllm-server: --lora %s=%s: %s\n", l.name.c_str(), l.path.c_str(), error.c_str());
                return 1;
            }
        }
        fastllm_session_free(probe);
    }
    // The draft model, checked against the model (same vocabulary) before anything starts.
    fastllm_model *draft = nullptr;
    if (!opt.draft_model_path.empty()) {
        fastllm_model_params mp = fastllm_model_default_params();
        mp.n_threads = opt.threads;
        mp.device = opt.device.empty() ? nullptr : opt.device.c_str();
        mp.n_gpu_layers = opt.gpu_layers;
        fastllm_session *probe = nullptr;
        fastllm_speculative_params sp = fastllm_speculative_default_params();
        if (fastllm_model_load(opt.draft_model_path.c_str(), &mp, &draft) != FASTLLM_OK ||
            fastllm_session_create(engine->model(), nullptr, &probe) != FASTLLM_OK ||
            (sp.draft_model = draft, fastllm_session_set_speculative(probe, &sp)) != FASTLLM_OK) {
            std::fprintf(stderr, "fastllm-server: draft model %s: %s\n", opt.draft_model_path.c_str(), fastllm_last_error());
            return 1;
        }
        fastllm_session_free(probe);
    }
    // Freed after the scheduler (declared later, destroyed first), whose sessions draft with it.
    std::unique_ptr<fastllm_model, void (*)(fastllm_model *)> draft_owner(draft, fastllm_model_free);
    Metrics metrics;
    SchedulerOptions so;
    so.max_sessions = generates ? opt.max_sessions : 0;
    so.max_queue = opt.max_queue;
    so.n_ctx = opt.n_ctx;
    so.prefill_chunk = opt.prefill_chunk;
    Scheduler scheduler(engine->model(), so, metrics);
    if (!scheduler.start(error)) {
        std::fprintf(stderr, "fastllm-server: %s\n", error.c_str());
        return 1;
    }

    std::atomic<bool> stopping{false};
    httplib::Server svr;
    // Each open connection holds a worker while it streams or waits, and an idle keep-alive one for
    // up to 5 s: room for every session, every queued request, and plenty for /health, /metrics,
    // idle clients and requests about to get 503. (Connections beyond that wait for a worker.)
    const size_t workers = std::min<size_t>((size_t)opt.max_sessions + (size_t)opt.max_queue + 64, 4096);
    svr.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
    svr.set_tcp_nodelay(true);  // each SSE event goes out at once, not after the client's delayed ACK
    svr.set_keep_alive_max_count(1000);
    svr.set_read_timeout(30, 0);
    svr.set_write_timeout(10, 0);
    ServerConfig config;
    config.model_name = opt.model_name;
    config.api_key = opt.api_key;
    config.max_body_bytes = opt.max_body_bytes;
    config.speculative = opt.speculative;
    config.draft_model = draft;
    config.n_draft = opt.n_draft;
    config.generates = generates;
    config.embeddings = opt.embeddings || !generates;
    Routes routes(*engine, scheduler, metrics, config, stopping);
    routes.install(svr);

    // httplib listens with a backlog of 5: a burst of new connections while the accepting thread is
    // not scheduled would have SYNs dropped (and retried after 1 s). Keep the socket to listen again
    // with a deeper backlog once it is bound.
    int listen_fd = -1;
    svr.set_socket_options([&listen_fd](int sock) {
        int yes = 1;
        setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
        listen_fd = sock;
    });

    int port = opt.port;
    if (port == 0) {
        port = svr.bind_to_any_port(opt.host);
        if (port < 0) port = 0;
    } else if (!svr.bind_to_port(opt.host, port)) {
        port = 0;
    }
    if (port == 0) {
        std::fprintf(stderr, "fastllm-server: cannot listen on %s:%d\n", opt.host.c_str(), opt.port);
        return 1;
    }
    if (listen_fd >= 0) listen(listen_fd, 1024);
    const bool v6 = opt.host.find(':') != std::string::npos;
    std::printf("fastllm-server: serving '%s' on http://%s%s%s:%d (%d sessions of %d tokens, queue %d, %s)\n",
                opt.model_name.c_str(), v6 ? "[" : "", opt.host.c_str(), v6 ? "]" : "", port, opt.max_sessions,
                scheduler.n_ctx(), opt.max_queue, opt.api_key.empty() ? "no API key" : "API key required");
    std::fflush(stdout);

    std::atomic<bool> listen_failed{false};
    std::mutex done_mu;
    std::condition_variable done_cv;
    bool listen_done = false;
    std::thread http([&] {
        svr.listen_after_bind();
        if (!stopping) {  // the listener ended by itself: wake main
            listen_failed = true;
            on_signal(0);
        }
        std::lock_guard<std::mutex> lock(done_mu);
        listen_done = true;
        done_cv.notify_all();
    });

    char sig = 0;
    while (read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    std::string why = listen_failed ? "the listener stopped" : sig == SIGINT ? "SIGINT" : "SIGTERM";
    if (sig == (char)kParentEnded) why = "its parent process (pid " + std::to_string(opt.parent_pid) + ") ended";
    std::fprintf(stderr, "fastllm-server: %s, shutting down\n", why.c_str());
    stopping = true;
    scheduler.shutdown();  // ends every request: waiting handlers answer, streams close with an error event
    routes.wait_for_streams(std::chrono::seconds(2));  // ... which they write before the server stops
    svr.stop();            // stops accepting; listen returns once every worker is done
    // Workers finish their last writes at once, but one that holds an idle keep-alive connection
    // waits for it up to the keep-alive timeout: past a short grace period, leave without them.
    std::unique_lock<std::mutex> lock(done_mu);
    if (!done_cv.wait_for(lock, std::chrono::seconds(2), [&] { return listen_done; })) {
        std::fflush(stdout);
        std::fflush(stderr);
        std::_Exit(listen_failed ? 1 : 0);
    }
    lock.unlock();
    http.join();
    return listen_failed ? 1 : 0;
}
