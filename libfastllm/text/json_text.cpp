#include "text/json_text.h"

namespace fastllm {

JsonParse parse_json(std::string_view text, int max_depth, nlohmann::ordered_json &out, std::string *error) {
    using json = nlohmann::ordered_json;
    struct TooDeep {};
    const auto depth_limit = [max_depth](int depth, json::parse_event_t, json &) {
        if (depth > max_depth) throw TooDeep{};
        return true;
    };
    try {
        out = json::parse(text.begin(), text.end(), depth_limit);
    } catch (const TooDeep &) {
        return JsonParse::TooDeep;
    } catch (const json::exception &e) {  // parse_error, or out_of_range for a number like 1e999
        if (error) *error = e.what();
        return JsonParse::Invalid;
    }
    return JsonParse::Ok;
}

}  // namespace fastllm
