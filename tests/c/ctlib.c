/* libctlib.so: a shared library linked into ctarget, with a variable of its
 * own that the tests watch as `libctlib.so:lib_counter` (ctarget reaches it
 * only through these functions, so that it is not copied into ctarget), and
 * a static named like one of ctarget's (`twin`: an ambiguous name). */
long lib_counter;
static long twin = 2;

void lib_set(long v)
{
    lib_counter = v; /* LINE:lib_set */
}

long *lib_addr(void)
{
    return &lib_counter; /* LINE:lib_addr */
}

long lib_twin(void)
{
    return twin;
}
