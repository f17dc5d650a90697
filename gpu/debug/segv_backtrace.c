// LD_PRELOAD helper: print a native backtrace on SIGSEGV/SIGABRT (Python's faulthandler shows only
// Python frames). Build: gcc -shared -fPIC -O0 -g segv_backtrace.c -o segv_backtrace.so
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_signal(int sig, siginfo_t* info, void* ctx) {
  (void)ctx;
  void* frames[64];
  char msg[128];
  int len = 0;
  const char* head = "\n[segv_backtrace] signal ";
  write(2, head, strlen(head));
  len = 0;
  int s = sig;
  char num[16];
  do { num[len++] = '0' + s % 10; s /= 10; } while (s);
  while (len) write(2, &num[--len], 1);
  unsigned long addr = (unsigned long)info->si_addr;
  strcpy(msg, " at address 0x");
  write(2, msg, strlen(msg));
  char hex[17]; int h = 16; hex[16] = 0;
  do { hex[--h] = "0123456789abcdef"[addr & 15]; addr >>= 4; } while (addr && h);
  write(2, hex + h, 16 - h);
  write(2, "\n", 1);
  int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigaction(SIGSEGV, &sa, 0);
  sigaction(SIGBUS, &sa, 0);
}
