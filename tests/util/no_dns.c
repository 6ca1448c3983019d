/* Preloaded into every test process (and the programs and Python peers the tests start) of the plain
 * build: the test suite must never send a DNS query. A forward lookup of a name that is neither a numeric
 * address nor listed in /etc/hosts is refused with EAI_NONAME and a line on stderr naming it, so the test
 * that asked fails and says why; a reverse lookup of an address /etc/hosts does not name is answered
 * numerically. Not preloaded into the sanitizer build (ASan's runtime must come first). */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

static bool numeric(const char *name)
{
    unsigned char buf[sizeof(struct in6_addr)];
    char v6[INET6_ADDRSTRLEN + 8];
    snprintf(v6, sizeof v6, "%s", name);
    char *pct = strchr(v6, '%'); /* fe80::1%eth0 */
    if (pct)
        *pct = '\0';
    return inet_pton(AF_INET, name, buf) == 1 || inet_pton(AF_INET6, v6, buf) == 1;
}

/* Is `name` (or the address text `addr`) a field of a line of /etc/hosts? */
static bool in_hosts(const char *name)
{
    FILE *f = fopen("/etc/hosts", "re");
    if (!f)
        return false;
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        line[strcspn(line, "#")] = '\0';
        for (char *save = NULL, *tok = strtok_r(line, " \t\r\n", &save); tok && !found;
             tok = strtok_r(NULL, " \t\r\n", &save))
            found = strcasecmp(tok, name) == 0;
    }
    fclose(f);
    return found;
}

static void refused(const char *what, const char *name)
{
    char msg[600];
    int n = snprintf(msg, sizeof msg, "no_dns: refused to %s '%s': tests use addresses or names from /etc/hosts, "
                     "never DNS (tests/util/no_dns.c)\n", what, name);
    ssize_t ignored = write(2, msg, n > 0 && (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
    (void)ignored;
}

static bool allowed(const char *name)
{
    return !name || !*name || numeric(name) || in_hosts(name);
}

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints, struct addrinfo **res)
{
    static int (*real)(const char *, const char *, const struct addrinfo *, struct addrinfo **);
    if (!real)
        real = (int (*)(const char *, const char *, const struct addrinfo *, struct addrinfo **))dlsym(RTLD_NEXT,
                                                                                                      "getaddrinfo");
    if (!(hints && (hints->ai_flags & AI_NUMERICHOST)) && !allowed(node)) {
        refused("resolve", node);
        return EAI_NONAME;
    }
    return real(node, service, hints, res);
}

struct hostent *gethostbyname(const char *name)
{
    static struct hostent *(*real)(const char *);
    if (!real)
        real = (struct hostent * (*)(const char *)) dlsym(RTLD_NEXT, "gethostbyname");
    if (!allowed(name)) {
        refused("resolve", name);
        h_errno = HOST_NOT_FOUND;
        return NULL;
    }
    return real(name);
}

int gethostbyname_r(const char *name, struct hostent *ret, char *buf, size_t buflen, struct hostent **result,
                    int *h_errnop)
{
    static int (*real)(const char *, struct hostent *, char *, size_t, struct hostent **, int *);
    if (!real)
        real = (int (*)(const char *, struct hostent *, char *, size_t, struct hostent **, int *))dlsym(
            RTLD_NEXT, "gethostbyname_r");
    if (!allowed(name)) {
        refused("resolve", name);
        *result = NULL;
        *h_errnop = HOST_NOT_FOUND;
        return 0;
    }
    return real(name, ret, buf, buflen, result, h_errnop);
}

int getnameinfo(const struct sockaddr *sa, socklen_t salen, char *host, socklen_t hostlen, char *serv,
                socklen_t servlen, int flags)
{
    static int (*real)(const struct sockaddr *, socklen_t, char *, socklen_t, char *, socklen_t, int);
    if (!real)
        real = (int (*)(const struct sockaddr *, socklen_t, char *, socklen_t, char *, socklen_t, int))dlsym(
            RTLD_NEXT, "getnameinfo");
    if (host && hostlen && !(flags & NI_NUMERICHOST)) {
        char addr[INET6_ADDRSTRLEN] = "";
        if (real(sa, salen, addr, sizeof addr, NULL, 0, NI_NUMERICHOST) != 0 || !in_hosts(addr))
            flags |= NI_NUMERICHOST; /* a PTR query otherwise */
    }
    return real(sa, salen, host, hostlen, serv, servlen, flags);
}
