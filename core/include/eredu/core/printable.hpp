#pragma once
/// \file
/// eredu::printable: text from a file (a tensor name, a path) made safe to print on a
/// terminal and to pass as a C string.
///
/// Names come from checkpoints and directories an attacker may control: a NUL would cut a
/// message off where it is printed as a C string, and escape sequences or newlines would
/// act on the terminal or forge log lines. Every eredu::Error message and log line goes
/// through printable().

#include <string>
#include <string_view>

namespace eredu {

/// `text` with every byte that is not printable escaped: NUL as `\0`, newline, tab and
/// carriage return as `\n`, `\t`, `\r`, other C0 controls, DEL, C1 controls (UTF-8
/// U+0080..U+009F) and bytes that are not valid UTF-8 as `\xNN`. Valid printable UTF-8 and
/// backslashes are kept as they are.
std::string printable(std::string_view text);

}  // namespace eredu
