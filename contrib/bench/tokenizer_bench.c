/* Encode speed of the tokenizer (core/tokenizer/tokenizer.h), single-threaded:
 * tokenizer_bench TOKENIZER.json TEXT [IDS.bin]; the first run starts with an empty word
 * cache, the next two reuse it; the last run's ids are written as int32 for comparison. */
#include "tokenizer/tokenizer.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
/* CPU time of this thread: on a shared machine it moves less than the wall clock */
static double cpu(void){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  tr_err err; struct tr_tokenizer*t=tr_tokenizer_load(argv[1],&err); if(!t){fprintf(stderr,"%s\n",err.msg);return 1;}
  FILE*f=fopen(argv[2],"rb"); fseek(f,0,SEEK_END); long n=ftell(f); fseek(f,0,SEEK_SET); char*s=malloc(n); if(fread(s,1,n,f)!=(size_t)n){fprintf(stderr,"short read\n");return 1;} fclose(f);
  for(int r=0;r<3;r++){ /* r=0: cold cache */
    struct tr_tokenizer*u=r==0?tr_tokenizer_load(argv[1],&err):t;
    int32_t*ids; size_t k; double t0=now(), c0=cpu();
    if(tr_tokenizer_encode(u,s,n,&ids,&k,&err)){fprintf(stderr,"%s\n",err.msg);return 1;}
    double dt=now()-t0, dc=cpu()-c0;
    fprintf(stderr,"%s: %zu ids in %.3f s = %.2f MB/s (CPU time %.3f s = %.2f MB/s)\n", r==0?"cold":"warm", k, dt, n/dt/1e6, dc, n/dc/1e6);
    if(r==2 && argc>3){FILE*o=fopen(argv[3],"wb"); fwrite(ids,4,k,o); fclose(o);}
    free(ids); if(r==0) tr_tokenizer_free(u);
  }
  tr_tokenizer_free(t); return 0;}
