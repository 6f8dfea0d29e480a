/* A shared object that is not a trainrun plugin (no entry symbol). */
int not_a_plugin(void);
int not_a_plugin(void) { return 42; }
