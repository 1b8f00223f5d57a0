// `dloco data ...` forwards to the `dloco-data` tool (a separate executable: it links SentencePiece, which
// cannot share a process with libprotobuf; see data/spm.h).
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "apps/commands.h"
#include "core/check.h"
#include "data/tokenizer.h"

namespace dloco::apps {

void add_data_commands(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Prepare corpora: `dloco data prepare --kjv --out data/kjv` "
                                          "(run `dloco data --help` for the flags)");
  data->prefix_command();
  data->set_help_flag();  // --help goes to dloco-data
  data->callback([data] {
    const std::string tool = data_tool_path().string();
    std::vector<std::string> args = {tool};
    for (const auto& a : data->remaining()) args.push_back(a);
    if (args.size() == 1) args.push_back("--help");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::fflush(stdout);
    ::execv(tool.c_str(), argv.data());
    throw InputError("cannot run '" + tool + "': " + std::strerror(errno) +
                     " (it is built with dloco; or set DLOCO_DATA_BIN)");
  });
}

}  // namespace dloco::apps
