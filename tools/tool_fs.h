/* tool_fs.h: the tools' scratch directories: a fresh one under $TMPDIR (or /tmp) for an
 * import, and its removal with everything under it. */
#ifndef FSDP_TOOLS_TOOL_FS_H
#define FSDP_TOOLS_TOOL_FS_H

#include <stdbool.h>
#include <stddef.h>

/* Makes a new directory "$TMPDIR/<name>-XXXXXX" (/tmp without TMPDIR) and writes its path to
 * out (size bytes). Returns false with errno set, out holding the path it tried. */
bool tool_make_scratch_dir(const char *name, char *out, size_t size);

/* Removes path and everything under it (symbolic links are removed, not followed); a path that
 * does not exist is fine. */
void tool_remove_tree(const char *path);

#endif
