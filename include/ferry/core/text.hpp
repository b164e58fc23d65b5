// Text from outside ferry (names in a trace, paths) made safe to print on a terminal.
#pragma once

#include <string>
#include <string_view>

namespace ferry {

/// `text` with every control character written as an escape, so that printing it cannot move the
/// cursor, clear the screen or retitle the terminal: C0 controls and DEL as `\xHH` (except `\n` and
/// `\t` when `keep_newlines`), C1 controls (U+0080..U+009F in UTF-8) as `\u0080`..`\u009f`, and a
/// backslash that starts such a sequence is not itself escaped. Other bytes pass unchanged.
[[nodiscard]] std::string escape_control(std::string_view text, bool keep_newlines = false);

}  // namespace ferry
