// cpu_name.h — the CPU's model name, which the C++ benches print with every figure.
#pragma once

#include <fstream>
#include <string>

inline std::string cpu_name() {
    std::ifstream f("/proc/cpuinfo");
    for (std::string line; std::getline(f, line);)
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    return "unknown CPU";
}
