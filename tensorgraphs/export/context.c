/* The context of an exported library (NAME is its prefix): one memory block holding the tensors (weights and
 * state, a spare buffer for each state a call replaces), scratch outputs and the arena, loaded from safetensors
 * bytes by tg_st_load and written back by NAME_save. The tables before this part give NAME_TENSORS,
 * NAME_tensors, NAME_tensor_offsets, NAME_spare_offsets, NAME_MEMORY_BYTES, NAME_file_header and
 * NAME_EMBEDDED_WEIGHTS (when the weights are inside the library). */
struct NAME_ctx {
    unsigned char *memory;
    unsigned char *tensor[NAME_TENSORS + 1];
    unsigned char *spare[NAME_TENSORS + 1];
};

static _Thread_local char NAME_error[1024];

static void NAME_fail(const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(NAME_error, sizeof NAME_error, format, args);
    va_end(args);
}

const char *NAME_last_error(void) { return NAME_error; }

/* The memory block, page-aligned; a large one on transparent huge pages (fewer TLB misses over a working set of
   megabytes), as the Python process maps its arenas. */
static unsigned char *NAME_allocate(void) {
    void *memory = mmap(NULL, NAME_MEMORY_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    if (NAME_MEMORY_BYTES >= NAME_HUGE_PAGE_BYTES) madvise(memory, NAME_MEMORY_BYTES, MADV_HUGEPAGE);
#endif
    return memory;
}

/* The whole file in memory (NULL with the error set when it cannot be read). */
static unsigned char *NAME_read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    long length = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) length = ftell(f);
    unsigned char *data = length >= 0 ? malloc((size_t)length + 1) : NULL;
    if (data && (fseek(f, 0, SEEK_SET) != 0 || fread(data, 1, (size_t)length, f) != (size_t)length)) {
        free(data);
        data = NULL;
    }
    if (f) fclose(f);
    if (!data) NAME_fail("NAME_create: cannot read the weights file '%s'", path);
    *size = data ? (size_t)length : 0;
    return data;
}

static int NAME_load(NAME_ctx *ctx, const unsigned char *file, size_t size, const char *where) {
    char reason[768];
    void *destinations[NAME_TENSORS + 1];
    for (int t = 0; t < NAME_TENSORS; t++) destinations[t] = ctx->tensor[t];
    if (tg_st_load(file, size, NAME_tensors, NAME_TENSORS, destinations, reason, sizeof reason) == 0) return 1;
    NAME_fail("NAME_create: the weights '%s' do not fit this library: %s", where, reason);
    return 0;
}

NAME_ctx *NAME_create(const char *weights_path) {
    NAME_ctx *ctx = calloc(1, sizeof *ctx);
    unsigned char *memory = NAME_allocate();
    if (!ctx || !memory) {
        free(ctx);
        if (memory) munmap(memory, NAME_MEMORY_BYTES);
        NAME_fail("NAME_create: out of memory (%zu bytes)", (size_t)NAME_MEMORY_BYTES);
        return NULL;
    }
    ctx->memory = memory;
    for (int t = 0; t < NAME_TENSORS; t++) {
        ctx->tensor[t] = memory + NAME_tensor_offsets[t];
        ctx->spare[t] = NAME_spare_offsets[t] ? memory + NAME_spare_offsets[t] : NULL;
    }
    int loaded = 0;
    if (weights_path) {
        size_t size = 0;
        unsigned char *file = NAME_read_file(weights_path, &size);
        loaded = file && NAME_load(ctx, file, size, weights_path);
        free(file);
    } else {
#ifdef NAME_EMBEDDED_WEIGHTS
        loaded = NAME_load(ctx, NAME_embedded_weights, (size_t)(NAME_embedded_weights_end - NAME_embedded_weights),
                           "(embedded)");
#else
        NAME_fail("NAME_create: this library has no embedded weights: pass the path of NAME.safetensors");
#endif
    }
    if (!loaded) {
        NAME_destroy(ctx);
        return NULL;
    }
    return ctx;
}

/* Checks a call's arguments (0 when it can run). */
static int NAME_check_call(const NAME_ctx *ctx, const void *const *inputs, void *const *outputs) {
    if (!ctx) {
        NAME_fail("NAME_run: the context is NULL");
        return -1;
    }
    for (int i = 0; i < NAME_num_inputs(); i++)
        if (!inputs || (!inputs[i] && NAME_inputs[i].bytes)) {
            NAME_fail("NAME_run: input %d (%s) is NULL", i, NAME_inputs[i].name);
            return -1;
        }
    for (int j = 0; j < NAME_num_outputs(); j++)
        if (!outputs || (!outputs[j] && NAME_outputs[j].bytes)) {
            NAME_fail("NAME_run: output %d (%s) is NULL", j, NAME_outputs[j].name);
            return -1;
        }
    return 0;
}

int NAME_save(const NAME_ctx *ctx, const char *path) {
    if (!ctx || !path) {
        NAME_fail("NAME_save: the context or the path is NULL");
        return -1;
    }
    size_t length = strlen(path);
    char *temporary = malloc(length + 5);
    FILE *f = NULL;
    if (temporary) {
        memcpy(temporary, path, length);
        memcpy(temporary + length, ".tmp", 5);
        f = fopen(temporary, "wb");
    }
    int ok = f != NULL;
    const uint64_t header = sizeof NAME_file_header - 1;
    unsigned char size[8];
    for (int k = 0; k < 8; k++) size[k] = (unsigned char)(header >> (8 * k));
    ok = ok && fwrite(size, 1, 8, f) == 8;
    ok = ok && fwrite(NAME_file_header, 1, header, f) == header;
    for (int t = 0; ok && t < NAME_TENSORS; t++)
        ok = fwrite(ctx->tensor[t], 1, NAME_tensors[t].bytes, f) == NAME_tensors[t].bytes;
    if (f) ok = fclose(f) == 0 && ok;
    ok = ok && rename(temporary, path) == 0; /* written whole, then moved over the old file */
    if (!ok) {
        if (f) remove(temporary);
        NAME_fail("NAME_save: cannot write '%s'", path);
    }
    free(temporary);
    return ok ? 0 : -1;
}

void NAME_destroy(NAME_ctx *ctx) {
    if (!ctx) return;
    munmap(ctx->memory, NAME_MEMORY_BYTES);
    free(ctx);
}
