/* The status page's server: state, store polling and HTTP (see status_server.h). */
#include "launcher/status_server.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/fs.h"
#include "common/log.h"
#include "launcher/status_render.h"
#include "rendezvous/evloop.h"
#include "rendezvous/store.h"
#include "rendezvous/store_auth.h"

#define HISTORY_CAP 2048      /* points per curve; a full curve keeps every other point */
#define MAX_HEADERS_BYTES 8192
#define MAX_BODY_BYTES 1024
#define CLIENT_TIMEOUT_S 10 /* evhttp's: a client that reads nothing of a reply this long */
/* A connection must bring a whole request (line, headers, body) within this many seconds of opening and of
 * its previous request: evhttp's own timeout restarts at every byte, so a client sending one byte at a time
 * (slowloris) would hold a connection for hours. While a reply is still going out to a client that reads
 * it, the clock waits. */
#define REQUEST_TIMEOUT_S 5
/* Connections served at once: a browser opens up to six, a Prometheus scraper one. At the cap the listener
 * pauses (new clients wait in the backlog) until one closes, which REQUEST_TIMEOUT_S bounds for idle ones. */
#define MAX_CONNECTIONS 128

/* One HTTP connection, from evhttp's request for its bufferevent (conn_bev_cb) to its close callback. */
struct http_conn {
    struct status_server *s;
    struct http_conn *prev, *next;
    struct bufferevent *bev;
    struct evhttp_connection *evcon; /* NULL until conn_deadline_cb's first run */
    struct event *deadline;
    size_t out_seen; /* reply bytes still unsent at the last check */
};

struct curve {
    double *x, *y;
    int n;
};

struct rank_state {
    cJSON *record;        /* the rank's last record, NULL before its first */
    char *record_text;
    double changed_mono;  /* when the record last changed */
    char exit_state[128]; /* "" while running */
    bool exit_ok;
    char previous_exit[128]; /* how the rank ended in the previous attempt, "" if none */
};

struct status_server {
    struct status_server_options o;
    char *run_id, *secret, *store_host, bind_addr[64];
    char page_token[STORE_STATUS_TOKEN_CHARS + 1]; /* "" without a secret: then only loopback clients */
    struct evloop loop;      /* the page's own thread and event_base */
    struct event_base *base; /* loop.base */
    struct evhttp *http;
    struct event *poll_ev;
    /* accept() out of descriptors: the listener paused (accept_resume re-enables it), one warning a second */
    struct evconnlistener *listener;
    struct event *accept_resume;
    double accept_warned_s;
    unsigned long accept_quiet;
    /* the connections (server thread only): MAX_CONNECTIONS of them pause the listener */
    struct http_conn *conns, *answering;
    int nconns;
    bool cap_paused, stopping;
    double cap_warned_s;
    unsigned long cap_quiet;
    int port;
    struct store_client *client; /* used only on the server thread */
    pthread_mutex_t mu;          /* guards everything below */
    struct rank_state *ranks;
    int generation, restarts;
    double start_wall, start_mono;
    char *failure;               /* root-cause record (JSON text) */
    char *previous_failure;      /* the previous attempt's, kept across a restart */
    struct curve loss, val, tps;
    int64_t last_step, last_val_step;
    double eta_mono0;            /* first step seen of this attempt: when and which */
    int64_t eta_step0;
};

static void curve_push(struct curve *c, double x, double y)
{
    if (!c->x) {
        c->x = malloc(HISTORY_CAP * sizeof *c->x);
        c->y = malloc(HISTORY_CAP * sizeof *c->y);
        if (!c->x || !c->y) {
            free(c->x);
            free(c->y);
            c->x = c->y = NULL;
            return;
        }
    }
    if (c->n == HISTORY_CAP) {
        for (int i = 0; i < HISTORY_CAP / 2; i++) {
            c->x[i] = c->x[2 * i];
            c->y[i] = c->y[2 * i];
        }
        c->n = HISTORY_CAP / 2;
    }
    c->x[c->n] = x;
    c->y[c->n] = y;
    c->n++;
}

static double num(const cJSON *o, const char *k, double dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* Called with mu held: a rank's new record text. */
static void take_record(struct status_server *s, int r, char *text)
{
    struct rank_state *rs = &s->ranks[r];
    if (rs->record_text && strcmp(rs->record_text, text) == 0) {
        free(text);
        return;
    }
    cJSON *o = cJSON_Parse(text);
    if (!o) {
        free(text);
        return;
    }
    free(rs->record_text);
    cJSON_Delete(rs->record);
    rs->record_text = text;
    rs->record = o;
    rs->changed_mono = clock_now_s();
    if (r != 0)
        return;
    int64_t step = (int64_t)num(o, "step", 0);
    if (step != s->last_step) {
        if (s->eta_step0 < 0 || step < s->last_step) {
            s->eta_step0 = step;
            s->eta_mono0 = clock_now_s();
        }
        s->last_step = step;
        double l = num(o, "loss", NAN), t = num(o, "tokens_per_s", NAN);
        if (isfinite(l))
            curve_push(&s->loss, (double)step, l);
        if (isfinite(t))
            curve_push(&s->tps, (double)step, t);
    }
    int64_t vs = (int64_t)num(o, "val_step", 0);
    double v = num(o, "val_loss", NAN);
    if (vs > 0 && vs != s->last_val_step && isfinite(v)) {
        s->last_val_step = vs;
        curve_push(&s->val, (double)vs, v);
    }
}

static void poll_store(struct status_server *s)
{
    if (!s->client) {
        struct store_client_options co = {.host = s->store_host, .port = s->o.store_port, .run_id = s->run_id,
                                          .secret = s->secret, .connect_timeout_s = 1, .default_timeout_s = 2};
        if (store_client_connect(&co, &s->client)) {
            s->client = NULL;
            return;
        }
    }
    for (int r = 0; r < s->o.world_size; r++) {
        char key[48];
        snprintf(key, sizeof key, "status/rank%d", r);
        const char *keys[1] = {key};
        bool ex = false;
        void *v = NULL;
        size_t len = 0;
        if (store_client_check(s->client, keys, 1, &ex))
            goto lost;
        if (!ex)
            continue;
        if (store_client_get(s->client, key, &v, &len, 2))
            goto lost;
        pthread_mutex_lock(&s->mu);
        take_record(s, r, v);
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_lock(&s->mu);
    int g = s->generation;
    bool have = s->failure != NULL;
    pthread_mutex_unlock(&s->mu);
    if (!have && g >= 0) {
        char key[48];
        snprintf(key, sizeof key, "rdzv/g%d/failed", g);
        const char *keys[1] = {key};
        bool ex = false;
        void *v = NULL;
        size_t len = 0;
        if (store_client_check(s->client, keys, 1, &ex))
            goto lost;
        if (ex && store_client_get(s->client, key, &v, &len, 2) == 0) {
            status_server_note_failure(s, v);
            free(v);
        }
    }
    return;
lost:
    store_client_close(s->client);
    s->client = NULL;
}

static void poll_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    poll_store(arg);
}

/* The /api/status object (docs/launcher.md). */
static cJSON *snapshot(struct status_server *s)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    double now = clock_now_s();
    pthread_mutex_lock(&s->mu);
    cJSON_AddStringToObject(o, "run_id", s->run_id);
    cJSON_AddBoolToObject(o, "live", true);
    cJSON_AddNumberToObject(o, "nnodes", s->o.nnodes);
    cJSON_AddNumberToObject(o, "world_size", s->o.world_size);
    cJSON_AddNumberToObject(o, "generation", s->generation);
    cJSON_AddNumberToObject(o, "restarts", s->restarts);
    cJSON_AddNumberToObject(o, "start_time", s->start_wall);
    cJSON_AddNumberToObject(o, "elapsed_s", now - s->start_mono);
    cJSON_AddNumberToObject(o, "stale_after_s", s->o.stale_s);
    const cJSON *r0 = s->ranks[0].record;
    double max_steps = num(r0, "max_steps", 0);
    if (r0 && s->eta_step0 >= 0 && s->last_step > s->eta_step0 && max_steps > s->last_step)
        cJSON_AddNumberToObject(o, "eta_s", (now - s->eta_mono0) / (double)(s->last_step - s->eta_step0) *
                                                (max_steps - (double)s->last_step));
    else
        cJSON_AddNullToObject(o, "eta_s");
    cJSON *ranks = cJSON_AddArrayToObject(o, "ranks");
    for (int r = 0; ranks && r < s->o.world_size; r++) {
        struct rank_state *rs = &s->ranks[r];
        cJSON *x = rs->record ? cJSON_Duplicate(rs->record, true) : cJSON_CreateObject();
        if (!x)
            continue;
        cJSON_DeleteItemFromObjectCaseSensitive(x, "rank");
        cJSON_AddNumberToObject(x, "rank", r);
        const char *state = "starting";
        if (rs->exit_state[0])
            state = rs->exit_ok ? "succeeded" : "failed";
        else if (rs->record && num(rs->record, "restart", 0) < s->generation)
            state = "starting"; /* its record is of an earlier attempt */
        else if (rs->record)
            state = now - rs->changed_mono > s->o.stale_s ? "stale" : "running";
        cJSON_AddStringToObject(x, "state", state);
        cJSON_AddStringToObject(x, "exit", rs->exit_state);
        cJSON_AddStringToObject(x, "previous_exit", rs->previous_exit);
        if (rs->record)
            cJSON_AddNumberToObject(x, "age_s", now - rs->changed_mono);
        else
            cJSON_AddNullToObject(x, "age_s");
        cJSON_AddItemToArray(ranks, x);
    }
    cJSON *fail = s->failure ? cJSON_Parse(s->failure) : NULL;
    if (fail)
        cJSON_AddItemToObject(o, "failure", fail);
    else
        cJSON_AddNullToObject(o, "failure");
    cJSON *pfail = s->previous_failure ? cJSON_Parse(s->previous_failure) : NULL;
    if (pfail)
        cJSON_AddItemToObject(o, "previous_failure", pfail);
    else
        cJSON_AddNullToObject(o, "previous_failure");
    cJSON *h = cJSON_AddObjectToObject(o, "history");
    const struct curve *cs[3] = {&s->loss, &s->val, &s->tps};
    const char *names[3] = {"loss", "val_loss", "tokens_per_s"};
    for (int c = 0; h && c < 3; c++) {
        cJSON *arr = cJSON_AddArrayToObject(h, names[c]);
        for (int i = 0; arr && i < cs[c]->n; i++) {
            double p[2] = {cs[c]->x[i], cs[c]->y[i]};
            cJSON_AddItemToArray(arr, cJSON_CreateDoubleArray(p, 2));
        }
    }
    pthread_mutex_unlock(&s->mu);
    return o;
}

static bool is_loopback(const char *addr)
{
    if (!addr)
        return false;
    if (strncmp(addr, "::ffff:", 7) == 0)
        addr += 7;
    return strncmp(addr, "127.", 4) == 0 || strcmp(addr, "::1") == 0;
}

/* Whether t is the page's token: compared in constant time, so timing tells nothing about its digits. */
static bool page_token_is(const struct status_server *s, const char *t)
{
    return s->page_token[0] && t && strlen(t) == STORE_STATUS_TOKEN_CHARS &&
           store_auth_equal((const uint8_t *)t, (const uint8_t *)s->page_token, STORE_STATUS_TOKEN_CHARS);
}

/* Loopback clients need nothing; others the page's own read-only token (store_auth_status_token), never the
 * store secret: whatever crosses this cleartext HTTP can be sniffed, and the secret would open the store. */
static bool token_ok(struct status_server *s, struct evhttp_request *req, const struct evhttp_uri *uri)
{
    char *peer = NULL;
    ev_uint16_t pport = 0;
    evhttp_connection_get_peer(evhttp_request_get_connection(req), &peer, &pport);
    if (is_loopback(peer))
        return true;
    if (!s->page_token[0])
        return false;
    const char *auth = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    if (auth && strncmp(auth, "Bearer ", 7) == 0 && page_token_is(s, auth + 7))
        return true;
    const char *q = evhttp_uri_get_query(uri);
    bool ok = false;
    struct evkeyvalq params;
    if (q && evhttp_parse_query_str(q, &params) == 0) {
        ok = page_token_is(s, evhttp_find_header(&params, "token"));
        evhttp_clear_headers(&params);
    }
    return ok;
}

/* Length of a well-formed UTF-8 sequence at p (at most n bytes there), 0 when the bytes are not one
 * (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF). */
static size_t utf8_valid_len(const unsigned char *p, size_t n)
{
    if (p[0] < 0x80)
        return 1;
    size_t len = p[0] >= 0xC2 && p[0] <= 0xDF   ? 2
                 : p[0] >= 0xE0 && p[0] <= 0xEF ? 3
                 : p[0] >= 0xF0 && p[0] <= 0xF4 ? 4
                                                : 0;
    if (len == 0 || len > n)
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    if ((p[0] == 0xE0 && p[1] < 0xA0) || (p[0] == 0xED && p[1] > 0x9F) || (p[0] == 0xF0 && p[1] < 0x90) ||
        (p[0] == 0xF4 && p[1] > 0x8F))
        return 0;
    return len;
}

/* body with every byte that does not start a well-formed UTF-8 sequence replaced by U+FFFD: a worker's
 * stderr tail (in the root cause) can hold any bytes, and cJSON prints string bytes as they are, so without
 * this /api/status would not be JSON (RFC 8259 requires UTF-8) and the page not the UTF-8 it declares.
 * Invalid bytes only occur inside strings (the structure is ASCII), so the result is still the same JSON. */
static char *utf8_sanitize(const char *body)
{
    const unsigned char *p = (const unsigned char *)body;
    size_t n = strlen(body), bad = 0;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_valid_len(p + i, n - i);
        bad += k == 0;
        i += k ? k : 1;
    }
    char *out = malloc(n + 2 * bad + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_valid_len(p + i, n - i);
        if (k) {
            memcpy(out + o, p + i, k);
            o += k;
            i += k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    out[o] = '\0';
    return out;
}

/* head: a HEAD request, answered with GET's headers (Content-Length included) and no body (RFC 9110 9.3.2). */
static void reply_to(struct evhttp_request *req, bool head, int code, const char *reason, const char *type,
                     const char *body)
{
    struct evkeyvalq *hdr = evhttp_request_get_output_headers(req);
    evhttp_add_header(hdr, "Content-Type", type);
    evhttp_add_header(hdr, "Cache-Control", "no-store");
    evhttp_add_header(hdr, "X-Content-Type-Options", "nosniff");
    char *clean = body ? utf8_sanitize(body) : NULL;
    const char *text = clean ? clean : body ? "" : NULL;
    struct evbuffer *b = evbuffer_new();
    if (head) {
        char len[32];
        snprintf(len, sizeof len, "%zu", text ? strlen(text) : (size_t)0);
        evhttp_add_header(hdr, "Content-Length", len);
    } else if (b && text) {
        evbuffer_add(b, text, strlen(text));
    }
    evhttp_send_reply(req, code, reason, b);
    if (b)
        evbuffer_free(b);
    free(clean);
}

static void reply(struct evhttp_request *req, int code, const char *reason, const char *type, const char *body)
{
    reply_to(req, evhttp_request_get_command(req) == EVHTTP_REQ_HEAD, code, reason, type, body);
}

static void http_answer(struct evhttp_request *req, struct status_server *s)
{
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
        reply(req, 405, "Method Not Allowed", "text/plain; charset=utf-8", "only GET and HEAD\n");
        return;
    }
    struct evhttp_uri *uri = evhttp_uri_parse(evhttp_request_get_uri(req));
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    if (!uri || !path) {
        reply(req, 400, "Bad Request", "text/plain; charset=utf-8", "malformed request target\n");
        if (uri)
            evhttp_uri_free(uri);
        return;
    }
    if (!token_ok(s, req, uri)) {
        reply(req, 401, "Unauthorized", "text/plain; charset=utf-8",
              "a client outside this host must give the job's token: Authorization: Bearer TOKEN or ?token=TOKEN\n");
        evhttp_uri_free(uri);
        return;
    }
    bool fragment = false;
    const char *q = evhttp_uri_get_query(uri);
    struct evkeyvalq params;
    if (q && evhttp_parse_query_str(q, &params) == 0) {
        const char *f = evhttp_find_header(&params, "fragment");
        fragment = f && strcmp(f, "1") == 0;
        evhttp_clear_headers(&params);
    }
    bool page = strcmp(path, "/") == 0 || strcmp(path, "/index.html") == 0;
    bool api = strcmp(path, "/api/status") == 0;
    bool metrics = strcmp(path, "/metrics") == 0;
    evhttp_uri_free(uri);
    if (!page && !api && !metrics) {
        reply(req, 404, "Not Found", "text/plain; charset=utf-8", "not found: try /, /api/status or /metrics\n");
        return;
    }
    cJSON *snap = snapshot(s);
    char *body = NULL;
    if (snap)
        body = api ? cJSON_PrintUnformatted(snap)
                   : metrics ? status_render_prometheus(snap) : status_render_html(snap, true, fragment);
    cJSON_Delete(snap);
    if (!body) {
        reply(req, 500, "Internal Server Error", "text/plain; charset=utf-8", "out of memory\n");
        return;
    }
    reply(req, 200, "OK",
          api ? "application/json" : metrics ? "text/plain; version=0.0.4; charset=utf-8" : "text/html; charset=utf-8",
          body);
    free(body);
}

/* ---- connections: the cap and the request deadline (server thread only) ---- */

static void cap_resume(struct status_server *s)
{
    if (s->cap_paused && !s->stopping && s->nconns < MAX_CONNECTIONS) {
        s->cap_paused = false;
        if (!event_pending(s->accept_resume, EV_TIMEOUT, NULL)) /* else the descriptor pause re-enables it */
            evconnlistener_enable(s->listener);
    }
}

static void conn_forget(struct http_conn *hc)
{
    struct status_server *s = hc->s;
    if (hc->prev)
        hc->prev->next = hc->next;
    else
        s->conns = hc->next;
    if (hc->next)
        hc->next->prev = hc->prev;
    s->nconns--;
    if (s->answering == hc)
        s->answering = NULL;
    struct bufferevent *bev = hc->bev;
    event_free(hc->deadline);
    free(hc);
    bufferevent_decref(bev); /* the reference conn_bev_cb took */
    cap_resume(s);
}

/* evhttp lets a connection go (closed by either side, a bad request, its timeout, evhttp_free). */
static void conn_closed_cb(struct evhttp_connection *evcon, void *arg)
{
    (void)evcon;
    conn_forget(arg);
}

static void conn_arm(struct http_conn *hc)
{
    struct timeval tv = {.tv_sec = REQUEST_TIMEOUT_S};
    hc->out_seen = evbuffer_get_length(bufferevent_get_output(hc->bev));
    event_add(hc->deadline, &tv);
}

/* First run (made active by conn_bev_cb, so before any byte of the connection is read): meet the
 * connection evhttp built on our bufferevent. It is the bufferevent's callback argument (evhttp 2.1 hands
 * it to nobody else); its close callback is how we learn that it ended. Then, each REQUEST_TIMEOUT_S
 * without a whole request: the connection is closed. A reply still going out to a client that reads it
 * restarts the clock. */
static void conn_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct http_conn *hc = arg;
    bufferevent_data_cb rcb, wcb;
    bufferevent_event_cb ecb = NULL;
    void *evcon = NULL;
    bufferevent_getcb(hc->bev, &rcb, &wcb, &ecb, &evcon);
    if (!ecb || !evcon || (hc->evcon && evcon != hc->evcon)) {
        /* evhttp let it go without telling us (bufferevent_free clears the callbacks; our reference keeps
         * the bufferevent, and so its descriptor, until here) */
        conn_forget(hc);
        return;
    }
    if (!hc->evcon) {
        hc->evcon = evcon;
        evhttp_connection_set_closecb(hc->evcon, conn_closed_cb, hc);
        conn_arm(hc);
        return;
    }
    size_t unsent = evbuffer_get_length(bufferevent_get_output(hc->bev));
    if (unsent > 0 && unsent < hc->out_seen) {
        conn_arm(hc);
        return;
    }
    log_debug("status page: closing a connection that sent no whole request in %d s", REQUEST_TIMEOUT_S);
    evhttp_connection_free(hc->evcon); /* calls conn_closed_cb: hc is freed */
}

/* evhttp asks for the bufferevent of each connection it accepts: the one it would make itself, which we
 * count, and at MAX_CONNECTIONS the listener pauses. Our reference on it, dropped in conn_forget, keeps it
 * valid whatever evhttp does meanwhile. On failure evhttp makes its own: the connection is served, only not
 * counted. */
static struct bufferevent *conn_bev_cb(struct event_base *base, void *arg)
{
    struct status_server *s = arg;
    struct http_conn *hc = calloc(1, sizeof *hc);
    if (!hc)
        return NULL;
    hc->s = s;
    hc->deadline = evtimer_new(base, conn_deadline_cb, hc);
    hc->bev = hc->deadline ? bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE) : NULL;
    if (!hc->bev) {
        if (hc->deadline)
            event_free(hc->deadline);
        free(hc);
        return NULL;
    }
    bufferevent_incref(hc->bev);
    hc->next = s->conns;
    if (s->conns)
        s->conns->prev = hc;
    s->conns = hc;
    s->nconns++;
    event_active(hc->deadline, EV_TIMEOUT, 0);
    if (s->nconns >= MAX_CONNECTIONS && !s->cap_paused) {
        s->cap_paused = true;
        evconnlistener_disable(s->listener);
        double now = clock_now_s();
        if (s->cap_warned_s == 0 || now - s->cap_warned_s >= 1.0) {
            char more[96] = "";
            if (s->cap_quiet)
                snprintf(more, sizeof more, " (%lu more times since the last such line)", s->cap_quiet);
            log_warn("status page: %d connections open, the most it serves at once: new ones wait until one "
                     "closes%s", MAX_CONNECTIONS, more);
            s->cap_warned_s = now;
            s->cap_quiet = 0;
        } else {
            s->cap_quiet++;
        }
    }
    return hc->bev;
}

/* A whole request: answered, and the connection's next one has REQUEST_TIMEOUT_S from now (unless answering
 * ended the connection). */
static void http_cb(struct evhttp_request *req, void *arg)
{
    struct status_server *s = arg;
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    s->answering = NULL;
    for (struct http_conn *hc = s->conns; evcon && hc; hc = hc->next)
        if (hc->evcon == evcon)
            s->answering = hc;
    http_answer(req, s);
    if (s->answering)
        conn_arm(s->answering);
    s->answering = NULL;
}

/* The listener's error callback gets the listener's user data, which evhttp sets to itself: servers are
 * found from their evhttp here (a launcher has one; tests may have a few). */
#define MAX_SERVERS 16
static pthread_mutex_t g_servers_mu = PTHREAD_MUTEX_INITIALIZER;
static struct status_server *g_servers[MAX_SERVERS];

static void servers_set(struct status_server *s, bool add)
{
    pthread_mutex_lock(&g_servers_mu);
    for (int i = 0; i < MAX_SERVERS; i++)
        if (add ? !g_servers[i] : g_servers[i] == s) {
            g_servers[i] = add ? s : NULL;
            break;
        }
    pthread_mutex_unlock(&g_servers_mu);
}

static struct status_server *servers_find(const struct evhttp *http)
{
    struct status_server *found = NULL;
    pthread_mutex_lock(&g_servers_mu);
    for (int i = 0; i < MAX_SERVERS && !found; i++)
        if (g_servers[i] && g_servers[i]->http == http)
            found = g_servers[i];
    pthread_mutex_unlock(&g_servers_mu);
    return found;
}

static void accept_resume_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct status_server *s = arg;
    if (!s->cap_paused) /* else the first connection to close re-enables it */
        evconnlistener_enable(s->listener);
}

/* Out of descriptors, the pending connection stays in the backlog and libevent would call accept() again
 * at once and warn each time (millions of lines): pause the listener 250 ms (the job needs its
 * descriptors more than the page does) and warn at most once a second, with the count of quiet ones. */
static void accept_error_cb(struct evconnlistener *l, void *http)
{
    int err = EVUTIL_SOCKET_ERROR();
    struct status_server *s = servers_find(http);
    if (!s) /* not one of ours (cannot happen): at least do not spin */
        return (void)evconnlistener_disable(l);
    double now = clock_now_s();
    if (s->accept_warned_s == 0 || now - s->accept_warned_s >= 1.0) {
        log_warn("status page: accept failed: %s (raise the open-files limit); pausing it 0.25 s at a time, %lu "
                 "failures not logged since the last warning", evutil_socket_error_to_string(err), s->accept_quiet);
        s->accept_warned_s = now;
        s->accept_quiet = 0;
    } else {
        s->accept_quiet++;
    }
    struct timeval pause = {.tv_sec = 0, .tv_usec = 250 * 1000};
    if (evconnlistener_disable(l) == 0 && event_add(s->accept_resume, &pause) != 0)
        evconnlistener_enable(l);
}

/* The first thing on the page's thread: the store's state before the first request. */
static void first_poll(void *arg) { poll_store(arg); }

/* Whether secret is a token the user can give a client: FSDP_RDZV_TOKEN or the secret file (store_auth.h),
 * not empty. A one-node job without either runs with a random secret the launcher made up, which no
 * client knows: a page on another address would then answer no one but say nothing, so it is refused as
 * docs/launcher.md says. */
static bool user_token(const char *secret)
{
    if (!secret || !*secret)
        return false;
    char *loaded = NULL, path[FSDP_PATH_MAX];
    enum store_secret_source src;
    bool known = store_secret_load(&loaded, &src, path, sizeof path) == 0 && src != STORE_SECRET_NONE && loaded &&
                 strcmp(loaded, secret) == 0;
    free(loaded);
    error_clear();
    return known;
}

int status_server_start(const struct status_server_options *opts, struct status_server **out)
{
    *out = NULL;
    const char *addr = opts->bind_addr && *opts->bind_addr ? opts->bind_addr : "127.0.0.1";
    if (!is_loopback(addr) && strcmp(addr, "localhost") != 0 && !user_token(opts->secret))
        return error_set(FSDP_EINVAL,
                         "--status_addr %s: a status page reachable from other hosts needs the job's token; set "
                         "FSDP_RDZV_TOKEN (the same on every node) or keep the default 127.0.0.1", addr);
    struct status_server *s = calloc(1, sizeof *s);
    if (!s)
        return error_set(FSDP_ENOMEM, "out of memory starting the status page");
    s->o = *opts;
    if (s->o.stale_s <= 0)
        s->o.stale_s = 30;
    if (s->o.poll_s <= 0)
        s->o.poll_s = 0.5;
    pthread_mutex_init(&s->mu, NULL);
    s->generation = -1;
    s->last_step = -1;
    s->eta_step0 = -1;
    s->start_wall = clock_wall_s();
    s->start_mono = clock_now_s();
    snprintf(s->bind_addr, sizeof s->bind_addr, "%s", addr);
    s->run_id = strdup(opts->run_id ? opts->run_id : "");
    s->store_host = strdup(opts->store_host ? opts->store_host : "127.0.0.1");
    s->secret = opts->secret ? strdup(opts->secret) : NULL;
    if (opts->secret && *opts->secret)
        store_auth_status_token(s->run_id ? s->run_id : "", opts->secret, s->page_token);
    s->ranks = calloc((size_t)(opts->world_size > 0 ? opts->world_size : 1), sizeof *s->ranks);
    int rc = 0;
    if (!s->run_id || !s->store_host || (opts->secret && !s->secret) || !s->ranks) {
        rc = error_set(FSDP_ENOMEM, "out of memory starting the status page");
        goto fail;
    }
    FSDP_TRY_GOTO(evloop_init(&s->loop, "the status page"), rc, fail);
    s->base = s->loop.base;
    s->http = evhttp_new(s->base);
    s->poll_ev = event_new(s->base, -1, EV_PERSIST, poll_cb, s);
    s->accept_resume = evtimer_new(s->base, accept_resume_cb, s);
    if (!s->http || !s->poll_ev || !s->accept_resume) {
        rc = error_set(FSDP_EIO, "libevent could not set up the status page");
        goto fail;
    }
    evhttp_set_max_headers_size(s->http, MAX_HEADERS_BYTES);
    evhttp_set_max_body_size(s->http, MAX_BODY_BYTES);
    evhttp_set_timeout(s->http, CLIENT_TIMEOUT_S);
    evhttp_set_allowed_methods(s->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                            EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
    evhttp_set_gencb(s->http, http_cb, s);
    evhttp_set_bevcb(s->http, conn_bev_cb, s);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(s->http, addr, (ev_uint16_t)opts->port);
    if (!bs) {
        rc = error_set(FSDP_EEXIST, "--status_port %d: cannot listen on %s:%d (%s); pick another port or 0 for a "
                       "free one", opts->port, addr, opts->port, strerror(errno));
        goto fail;
    }
    s->listener = evhttp_bound_socket_get_listener(bs);
    servers_set(s, true);
    evconnlistener_set_error_cb(s->listener, accept_error_cb);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl);
    s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                              : ((struct sockaddr_in *)&ss)->sin_port);
    struct timeval tv = {.tv_sec = (time_t)s->o.poll_s, .tv_usec = (suseconds_t)((s->o.poll_s - (time_t)s->o.poll_s) * 1e6)};
    event_add(s->poll_ev, &tv);
    FSDP_TRY_GOTO(evloop_start(&s->loop, "the status page", first_poll, s), rc, fail);
    *out = s;
    return 0;
fail:
    status_server_stop(s);
    return rc;
}

int status_server_port(const struct status_server *s) { return s ? s->port : -1; }

const char *status_server_token(const struct status_server *s) { return s ? s->page_token : ""; }

bool status_server_public(const struct status_server *s)
{
    return s && !is_loopback(s->bind_addr) && strcmp(s->bind_addr, "localhost") != 0;
}

void status_server_note_attempt(struct status_server *s, int generation, int restarts)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    if (generation != s->generation) {
        s->generation = generation;
        s->restarts = restarts;
        for (int r = 0; r < s->o.world_size; r++) {
            if (s->ranks[r].exit_state[0])
                memcpy(s->ranks[r].previous_exit, s->ranks[r].exit_state, sizeof s->ranks[r].previous_exit);
            s->ranks[r].exit_state[0] = 0;
        }
        if (s->failure) {
            free(s->previous_failure);
            s->previous_failure = s->failure;
        }
        s->failure = NULL;
        s->eta_step0 = -1;
    }
    pthread_mutex_unlock(&s->mu);
}

void status_server_note_exit(struct status_server *s, int rank, const char *state, bool ok)
{
    if (!s || rank < 0 || rank >= s->o.world_size)
        return;
    pthread_mutex_lock(&s->mu);
    snprintf(s->ranks[rank].exit_state, sizeof s->ranks[rank].exit_state, "%s", state ? state : "");
    if (!s->ranks[rank].exit_state[0])
        snprintf(s->ranks[rank].exit_state, sizeof s->ranks[rank].exit_state, "%s", ok ? "exited 0" : "failed");
    s->ranks[rank].exit_ok = ok;
    pthread_mutex_unlock(&s->mu);
}

void status_server_note_failure(struct status_server *s, const char *record)
{
    if (!s || !record)
        return;
    pthread_mutex_lock(&s->mu);
    if (!s->failure)
        s->failure = strdup(record);
    pthread_mutex_unlock(&s->mu);
}

void status_server_stop(struct status_server *s)
{
    if (!s)
        return;
    evloop_stop(&s->loop);
    servers_set(s, false);
    /* the listener goes with evhttp: closing connections must not re-enable it */
    s->stopping = true;
    if (s->http)
        evhttp_free(s->http);
    /* evhttp_free closed every connection it had met (each close callback freed its http_conn); those
     * accepted but not met yet remain */
    while (s->conns)
        conn_forget(s->conns);
    if (s->poll_ev)
        event_free(s->poll_ev);
    if (s->accept_resume)
        event_free(s->accept_resume);
    evloop_free(&s->loop);
    store_client_close(s->client);
    for (int r = 0; s->ranks && r < s->o.world_size; r++) {
        cJSON_Delete(s->ranks[r].record);
        free(s->ranks[r].record_text);
    }
    const struct curve *cs[3] = {&s->loss, &s->val, &s->tps};
    for (int c = 0; c < 3; c++) {
        free(cs[c]->x);
        free(cs[c]->y);
    }
    free(s->ranks);
    free(s->failure);
    free(s->previous_failure);
    free(s->run_id);
    free(s->store_host);
    free(s->secret);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
