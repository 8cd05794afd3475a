/* A hostile compiled "server" for tests/confine_launchers.rs (the launch form of a binary in
 * ~/.cargo/bin): each line of $PROBE_OPS is an operation, KIND ARG (read PATH, write PATH,
 * list PATH, connect PORT, unix PATH), given in the environment and not as arguments (a file
 * named on a server's command line is granted to it); it tries each and prints one JSON-RPC
 * notification,
 * {"method":"probe","params":{"results":[...]}} with "ok" or "err:CODE" for each, then exits.
 * Built by the test with the system's cc. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static const char *code(int e) {
  switch (e) {
  case EACCES: return "EACCES";
  case EPERM: return "EPERM";
  case ENOENT: return "ENOENT";
  case ECONNREFUSED: return "ECONNREFUSED";
  default: return "OTHER";
  }
}

static int attempt(const char *kind, const char *arg) {
  if (!strcmp(kind, "read")) {
    int fd = open(arg, O_RDONLY);
    if (fd < 0) return errno;
    char buf[64];
    int n = read(fd, buf, sizeof buf);
    int e = n < 0 ? errno : 0;
    close(fd);
    return e;
  }
  if (!strcmp(kind, "write")) {
    int fd = open(arg, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return errno;
    int e = write(fd, "written by the server", 21) < 0 ? errno : 0;
    close(fd);
    return e;
  }
  if (!strcmp(kind, "list")) {
    DIR *d = opendir(arg);
    if (!d) return errno;
    closedir(d);
    return 0;
  }
  if (!strcmp(kind, "connect")) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) return errno;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(arg))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int e = connect(s, (struct sockaddr *)&a, sizeof a) < 0 ? errno : 0;
    close(s);
    return e;
  }
  if (!strcmp(kind, "unix")) {
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (s < 0) return errno;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strncpy(a.sun_path, arg, sizeof a.sun_path - 1);
    int e = connect(s, (struct sockaddr *)&a, sizeof a) < 0 ? errno : 0;
    close(s);
    return e;
  }
  return EINVAL;
}

int main(void) {
  const char *env = getenv("PROBE_OPS");
  char *ops = strdup(env ? env : "");
  printf("{\"jsonrpc\":\"2.0\",\"method\":\"probe\",\"params\":{\"results\":[");
  int first = 1;
  for (char *line = strtok(ops, "\n"); line; line = strtok(NULL, "\n")) {
    char *arg = strchr(line, ' ');
    if (!arg) continue;
    *arg++ = 0;
    int e = attempt(line, arg);
    printf("%s\"%s%s\"", first ? "" : ",", e ? "err:" : "ok", e ? code(e) : "");
    first = 0;
  }
  printf("]}}\n");
  free(ops);
  return 0;
}
