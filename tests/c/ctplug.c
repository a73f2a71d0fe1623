/* libctplug.so: loaded by ctarget with dlopen after wpd attached; the tests
 * watch `plug_counter` by name once it is loaded. */
long plug_counter;

void plug_set(long v)
{
    plug_counter = v; /* LINE:plug_set */
}
