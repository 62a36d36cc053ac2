/*
 * Creating one of the plugin's record files (workload counts, timings) inside the directory the job named.
 *
 * The file is <prefix>.<host>.<pid>.<n>.txt: the host name reduced to [A-Za-z0-9.-] (never leading '.'), so
 * the name stays one plain component of the directory, and n counts the files this prefix made in the
 * process. It is created with O_EXCL and O_NOFOLLOW, so an existing file or a planted link is never written
 * through. Shared by topotune_tuner.c and topotune_profiler.c; each includes its own copy of these statics.
 */
#ifndef TOPOTUNE_RECORD_FILE_H_
#define TOPOTUNE_RECORD_FILE_H_

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <unistd.h>

#define TT_RECORD_NAME_MAX (HOST_NAME_MAX + 96)

/* Fills host (HOST_NAME_MAX + 1 bytes) and name (TT_RECORD_NAME_MAX bytes); NULL with errno set on failure. */
static FILE* ttCreateRecordFile(int dir, const char* prefix, int* sequence, char* host, char* name) {
  snprintf(host, HOST_NAME_MAX + 1, "unknown");
  if (gethostname(host, HOST_NAME_MAX + 1) != 0) snprintf(host, HOST_NAME_MAX + 1, "unknown");
  host[HOST_NAME_MAX] = '\0';
  for (char* p = host; *p; p++) {
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '.'))
      *p = '_';
  }
  if (host[0] == '.') host[0] = '_';
  int n = __atomic_fetch_add(sequence, 1, __ATOMIC_RELAXED);
  snprintf(name, TT_RECORD_NAME_MAX, "%s.%s.%ld.%d.txt", prefix, host, (long)getpid(), n);
  int fd = openat(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  FILE* out = fd < 0 ? NULL : fdopen(fd, "w");
  if (out == NULL && fd >= 0) {
    int why = errno; /* the caller reports fdopen's reason, not close's */
    close(fd);
    errno = why;
  }
  return out;
}

#endif
