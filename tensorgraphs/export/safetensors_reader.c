/* The safetensors reader of an exported library: an 8-byte little-endian header length, a JSON header
 * {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ..., "__metadata__": {...}}, then the
 * data. Every tensor the library holds must be present with its dtype and shape; other entries are ignored. Any
 * malformed, truncated or mismatching file is refused with a message, never read past its end. */
typedef struct {
    const char *name;   /* UTF-8 */
    const char *dtype;  /* the safetensors dtype: "F32", "I64", ... */
    int rank;
    const int64_t *shape;
    size_t bytes;
} tg_st_entry;

typedef struct {
    const unsigned char *at, *end;
} tg_st_cursor;

static void tg_st_space(tg_st_cursor *c) {
    while (c->at < c->end && (*c->at == ' ' || *c->at == '\t' || *c->at == '\n' || *c->at == '\r')) c->at++;
}

static int tg_st_take(tg_st_cursor *c, unsigned char expected) {
    tg_st_space(c);
    if (c->at >= c->end || *c->at != expected) return 0;
    c->at++;
    return 1;
}

static int tg_st_hex(tg_st_cursor *c, unsigned *value) {
    *value = 0;
    for (int k = 0; k < 4; k++) {
        if (c->at >= c->end) return 0;
        unsigned char h = *c->at++;
        unsigned digit = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                         : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 16;
        if (digit == 16) return 0;
        *value = *value * 16 + digit;
    }
    return 1;
}

/* A JSON string, unescaped to UTF-8 into out[0..capacity) (NUL-terminated; longer strings are refused). */
static int tg_st_string(tg_st_cursor *c, char *out, size_t capacity) {
    size_t n = 0;
    if (!tg_st_take(c, '"')) return 0;
    while (c->at < c->end && *c->at != '"') {
        unsigned code = *c->at++;
        if (code == '\\') {
            if (c->at >= c->end) return 0;
            unsigned char e = *c->at++;
            switch (e) {
                case 'b': code = '\b'; break;
                case 'f': code = '\f'; break;
                case 'n': code = '\n'; break;
                case 'r': code = '\r'; break;
                case 't': code = '\t'; break;
                case 'u':
                    if (!tg_st_hex(c, &code)) return 0;
                    if (code >= 0xD800 && code < 0xDC00) { /* a surrogate pair */
                        unsigned low;
                        if (c->end - c->at < 6 || c->at[0] != '\\' || c->at[1] != 'u') return 0;
                        c->at += 2;
                        if (!tg_st_hex(c, &low) || low < 0xDC00 || low >= 0xE000) return 0;
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                    }
                    break;
                default: code = e; break; /* \" \\ \/ */
            }
            unsigned char bytes[4];
            int count = code < 0x80 ? 1 : code < 0x800 ? 2 : code < 0x10000 ? 3 : 4;
            if (count == 1) bytes[0] = (unsigned char)code;
            else {
                for (int k = count - 1; k > 0; k--, code >>= 6) bytes[k] = (unsigned char)(0x80 | (code & 0x3F));
                bytes[0] = (unsigned char)((0xF00 >> count) | code);
            }
            if (n + (size_t)count >= capacity) return 0;
            memcpy(out + n, bytes, (size_t)count);
            n += (size_t)count;
        } else {
            if (n + 1 >= capacity) return 0;
            out[n++] = (char)code;
        }
    }
    out[n] = '\0';
    return tg_st_take(c, '"');
}

static int tg_st_integer(tg_st_cursor *c, int64_t *value) {
    tg_st_space(c);
    int64_t v = 0;
    const unsigned char *start = c->at;
    while (c->at < c->end && *c->at >= '0' && *c->at <= '9') {
        if (v > (INT64_MAX - 9) / 10) return 0;
        v = v * 10 + (*c->at++ - '0');
    }
    *value = v;
    return c->at > start;
}

/* Skips any JSON value (nested to a bounded depth). */
static int tg_st_skip(tg_st_cursor *c, int depth) {
    tg_st_space(c);
    if (c->at >= c->end || depth > 32) return 0;
    unsigned char first = *c->at;
    if (first == '"') {
        while (c->at < c->end) { /* strings of any length */
            c->at++;
            if (c->at < c->end && *c->at == '\\') c->at++;
            else if (c->at < c->end && *c->at == '"') { c->at++; return 1; }
        }
        return 0;
    }
    if (first == '{' || first == '[') {
        unsigned char close = first == '{' ? '}' : ']';
        c->at++;
        if (tg_st_take(c, close)) return 1;
        do {
            if (first == '{') { /* a key: a string of any length */
                tg_st_space(c);
                if (c->at >= c->end || *c->at != '"' || !tg_st_skip(c, depth + 1) || !tg_st_take(c, ':')) return 0;
            }
            if (!tg_st_skip(c, depth + 1)) return 0;
        } while (tg_st_take(c, ','));
        return tg_st_take(c, close);
    }
    while (c->at < c->end && *c->at != ',' && *c->at != '}' && *c->at != ']') c->at++; /* number, literal */
    return 1;
}

/* Reads tensor `e`'s entry (the value of its key) and copies its data into `dst`. */
static int tg_st_read_entry(tg_st_cursor *c, const tg_st_entry *e, const unsigned char *data, uint64_t data_size,
                            void *dst, char *error, size_t error_size) {
    char key[32], dtype[16] = "";
    int64_t shape[16], begin = -1, end = -1;
    int rank = -1;
    if (!tg_st_take(c, '{')) return 0;
    do {
        if (!tg_st_string(c, key, sizeof key) || !tg_st_take(c, ':')) return 0;
        if (!strcmp(key, "dtype")) {
            if (!tg_st_string(c, dtype, sizeof dtype)) return 0;
        } else if (!strcmp(key, "shape")) {
            rank = 0;
            if (!tg_st_take(c, '[')) return 0;
            if (!tg_st_take(c, ']')) {
                do {
                    if (rank == 16 || !tg_st_integer(c, &shape[rank++])) return 0;
                } while (tg_st_take(c, ','));
                if (!tg_st_take(c, ']')) return 0;
            }
        } else if (!strcmp(key, "data_offsets")) {
            if (!tg_st_take(c, '[') || !tg_st_integer(c, &begin) || !tg_st_take(c, ',') || !tg_st_integer(c, &end)
                || !tg_st_take(c, ']')) return 0;
        } else if (!tg_st_skip(c, 1)) return 0;
    } while (tg_st_take(c, ','));
    if (!tg_st_take(c, '}')) return 0;
    int same_shape = rank == e->rank;
    for (int d = 0; same_shape && d < rank; d++) same_shape = shape[d] == e->shape[d];
    if (strcmp(dtype, e->dtype) || !same_shape) {
        snprintf(error, error_size, "tensor '%s' is %s of rank %d in the file; the library needs %s of rank %d with "
                 "the shape it was built for", e->name, dtype, rank, e->dtype, e->rank);
        return -1;
    }
    if (begin < 0 || end < begin || (uint64_t)(end - begin) != e->bytes || (uint64_t)end > data_size) {
        snprintf(error, error_size, "tensor '%s' has data offsets [%lld, %lld] outside the file's %llu data bytes "
                 "(truncated?)", e->name, (long long)begin, (long long)end, (unsigned long long)data_size);
        return -1;
    }
    if (e->bytes) memcpy(dst, data + begin, e->bytes);
    return 1;
}

/* Copies each of the `count` tensors `wanted` from the safetensors bytes file[0..size) into dst[i]; 0 on success,
 * else -1 with the reason in `error`. */
static int tg_st_load(const unsigned char *file, size_t size, const tg_st_entry *wanted, int count, void *const *dst,
                      char *error, size_t error_size) {
    char name[1024];
    uint64_t header_size = 0;
    int found = 0;
    if (size < 8) {
        snprintf(error, error_size, "%zu bytes: too short for a safetensors file (truncated?)", size);
        return -1;
    }
    for (int k = 7; k >= 0; k--) header_size = header_size << 8 | file[k];
    if (header_size > size - 8) {
        snprintf(error, error_size, "its header says %llu bytes but the file has %zu (truncated, or not safetensors)",
                 (unsigned long long)header_size, size - 8);
        return -1;
    }
    tg_st_cursor c = {file + 8, file + 8 + header_size};
    const unsigned char *data = c.end;
    uint64_t data_size = (uint64_t)(file + size - data);
    unsigned char *seen = calloc((size_t)count + 1, 1);
    if (!seen) {
        snprintf(error, error_size, "out of memory");
        return -1;
    }
    int ok = tg_st_take(&c, '{');
    if (ok && !tg_st_take(&c, '}')) {
        do {
            ok = tg_st_string(&c, name, sizeof name) && tg_st_take(&c, ':');
            int index = -1;
            for (int i = 0; ok && i < count && index < 0; i++)
                if (!seen[i] && !strcmp(name, wanted[i].name)) index = i;
            if (!ok) break;
            if (index < 0) {
                ok = tg_st_skip(&c, 1);
                continue;
            }
            int read = tg_st_read_entry(&c, &wanted[index], data, data_size, dst[index], error, error_size);
            if (read < 0) {
                free(seen);
                return -1;
            }
            ok = read;
            seen[index] = 1;
            found++;
        } while (ok && tg_st_take(&c, ','));
        ok = ok && tg_st_take(&c, '}');
    }
    if (!ok) {
        snprintf(error, error_size, "its JSON header is malformed near byte %zu", (size_t)(c.at - file));
        free(seen);
        return -1;
    }
    for (int i = 0; i < count && found < count; i++)
        if (!seen[i]) {
            snprintf(error, error_size, "it has no tensor '%s'", wanted[i].name);
            free(seen);
            return -1;
        }
    free(seen);
    return 0;
}
