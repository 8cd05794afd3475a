/* The hostile compiled "server" of tests/confine_launchers.rs and benches/srt_compare.sh (the
 * launch form of a binary in ~/.cargo/bin), built by each with the system's cc. Each line of
 * $PROBE_OPS is an operation, KIND ARG, given in the environment and not as arguments (a file
 * named on a server's command line is granted to it); it tries each and prints one JSON-RPC
 * notification, {"method":"probe","params":{"results":[...]}} with "ok", "ok:direct",
 * "ok:proxy" or "err:CODE" for each (no file contents: "ok" for a read that worked), then exits.
 *
 * Kinds, as the npm probe's (tests/launchers/probe/probe.js):
 *   read PATH, write PATH, list PATH (open the directory), connect PORT (TCP to 127.0.0.1),
 *   unix PATH (a Unix socket), utime PATH (set the file's times: metadata, no contents),
 *   tcp HOST:PORT (directly, then, if that fails, through the HTTP proxy the environment names,
 *   by CONNECT, as srt's sandbox offers: "ok:direct", "ok:proxy" or
 *   "err:DIRECT_CODE;proxy:STATUS"). */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

static const char *code(int e) {
  switch (e) {
  case EACCES: return "EACCES";
  case EPERM: return "EPERM";
  case ENOENT: return "ENOENT";
  case EROFS: return "EROFS";
  case ECONNREFUSED: return "ECONNREFUSED";
  case ENETUNREACH: return "ENETUNREACH";
  case ETIMEDOUT: return "ETIMEDOUT";
  case EAFNOSUPPORT: return "EAFNOSUPPORT";
  case EHOSTUNREACH: return "EHOSTUNREACH";
  default: return "OTHER";
  }
}

/* A TCP connection to HOST:PORT (numeric or a name): its descriptor, or -errno. */
static int dial(const char *host, const char *port) {
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
  int g = getaddrinfo(host, port, &hints, &ai);
  if (g) return -(g == EAI_SYSTEM ? errno : EHOSTUNREACH);
  int s = socket(ai->ai_family, ai->ai_socktype, 0);
  if (s < 0) { int e = errno; freeaddrinfo(ai); return -e; }
  struct timeval tv = {.tv_sec = 5};
  setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  int e = connect(s, ai->ai_addr, ai->ai_addrlen) < 0 ? errno : 0;
  freeaddrinfo(ai);
  if (e) { close(s); return -e; }
  return s;
}

static int unhex(int c) { return c >= 'a' ? c - 'a' + 10 : c >= 'A' ? c - 'A' + 10 : c - '0'; }

static void urldecode(char *s) {
  char *o = s;
  for (; *s; s++) {
    if (*s == '%' && s[1] && s[2]) { *o++ = (char)(unhex(s[1]) * 16 + unhex(s[2])); s += 2; }
    else *o++ = *s;
  }
  *o = 0;
}

static void base64(const char *in, char *out) {
  static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t n = strlen(in), i;
  for (i = 0; i + 2 < n; i += 3) {
    unsigned v = (unsigned char)in[i] << 16 | (unsigned char)in[i + 1] << 8 | (unsigned char)in[i + 2];
    *out++ = t[v >> 18]; *out++ = t[v >> 12 & 63]; *out++ = t[v >> 6 & 63]; *out++ = t[v & 63];
  }
  if (n - i == 1) {
    unsigned v = (unsigned char)in[i] << 16;
    *out++ = t[v >> 18]; *out++ = t[v >> 12 & 63]; *out++ = '='; *out++ = '=';
  } else if (n - i == 2) {
    unsigned v = (unsigned char)in[i] << 16 | (unsigned char)in[i + 1] << 8;
    *out++ = t[v >> 18]; *out++ = t[v >> 12 & 63]; *out++ = t[v >> 6 & 63]; *out++ = '=';
  }
  *out = 0;
}

/* CONNECT TARGET through the http:// proxy URL (its user and password, if any, as Basic
 * credentials): the status ("200", "403") or why it failed ("proxy-CODE"). */
static void via_proxy(const char *url, const char *target, char *status, size_t len) {
  static char u[4096], cred[8200], b64[11000], req[12000];
  snprintf(u, sizeof u, "%s", url + strlen("http://"));
  char *slash = strchr(u, '/');
  if (slash) *slash = 0;
  char *hostport = u, *userinfo = NULL, *at = strrchr(u, '@');
  if (at) { *at = 0; userinfo = u; hostport = at + 1; }
  char *colon = strrchr(hostport, ':');
  const char *port = "80";
  if (colon) { *colon = 0; port = colon + 1; }
  int s = dial(hostport, port);
  if (s < 0) { snprintf(status, len, "proxy-%s", code(-s)); return; }
  int n = snprintf(req, sizeof req, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n", target, target);
  if (userinfo) {
    char *pass = strchr(userinfo, ':');
    if (pass) *pass++ = 0;
    urldecode(userinfo);
    if (pass) urldecode(pass);
    snprintf(cred, sizeof cred, "%s:%s", userinfo, pass ? pass : "");
    base64(cred, b64);
    n += snprintf(req + n, sizeof req - n, "Proxy-Authorization: Basic %s\r\n", b64);
  }
  n += snprintf(req + n, sizeof req - n, "\r\n");
  char buf[512] = {0};
  if (write(s, req, n) != n || read(s, buf, sizeof buf - 1) <= 0) {
    snprintf(status, len, "proxy-%s", code(errno));
  } else {
    char *sp = strchr(buf, ' ');
    snprintf(status, len, "%.3s", sp ? sp + 1 : "???");
  }
  close(s);
}

static const char *proxy_env(void) {
  const char *names[] = {"https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"};
  for (unsigned i = 0; i < sizeof names / sizeof *names; i++) {
    const char *v = getenv(names[i]);
    if (v && !strncmp(v, "http://", 7)) return v;
  }
  return NULL;
}

/* The tcp operation: its result string into RESULT. */
static void tcp(const char *arg, char *result, size_t len) {
  char host[256];
  const char *colon = strrchr(arg, ':');
  if (!colon) { snprintf(result, len, "err:EINVAL"); return; }
  snprintf(host, sizeof host, "%.*s", (int)(colon - arg), arg);
  int s = dial(host, colon + 1);
  if (s >= 0) { close(s); snprintf(result, len, "ok:direct"); return; }
  const char *d = code(-s);
  const char *proxy = proxy_env();
  if (!proxy) { snprintf(result, len, "err:%s", d); return; }
  char status[64];
  via_proxy(proxy, arg, status, sizeof status);
  if (!strcmp(status, "200")) snprintf(result, len, "ok:proxy");
  else snprintf(result, len, "err:%s;proxy:%s", d, status);
}

/* Every other operation: 0 if it worked, else its errno. */
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
  if (!strcmp(kind, "utime")) {
    struct timeval tv[2] = {{.tv_sec = 1000000000}, {.tv_sec = 1000000000}};
    return utimes(arg, tv) < 0 ? errno : 0;
  }
  return EINVAL;
}

int main(void) {
  const char *env = getenv("PROBE_OPS");
  char *ops = strdup(env ? env : "");
  printf("{\"jsonrpc\":\"2.0\",\"method\":\"probe\",\"params\":{\"results\":[");
  int first = 1;
  /* strtok_r: the name lookups of tcp must not disturb the walk over the lines. */
  char *save = NULL;
  for (char *line = strtok_r(ops, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char *arg = strchr(line, ' ');
    if (!arg) continue;
    *arg++ = 0;
    char result[256];
    if (!strcmp(line, "tcp")) {
      tcp(arg, result, sizeof result);
    } else {
      int e = attempt(line, arg);
      snprintf(result, sizeof result, "%s%s", e ? "err:" : "ok", e ? code(e) : "");
    }
    printf("%s\"%s\"", first ? "" : ",", result);
    first = 0;
  }
  printf("]}}\n");
  fflush(stdout);
  free(ops);
  return 0;
}
